"""Held-out perplexity of a checkpointed model with a fraction of its stages omitted.

SkipPipe trains every microbatch on a subset of the stages, so the model should tolerate
stages being skipped at inference too (the paper: +7% perplexity with half of them omitted).
This loads the per-stage checkpoints a run wrote (peer/pipeline/checkpoint.py, one file per
stage), then measures the held-out perplexity of the embedded corpus (or --data) through
stage 0, every stage, and with round(F x (S - 1)) of the non-stage-0 stages omitted: the
mean over random choices and the worst choice (all choices tried when there are at most
--max-choices of them, else that many random ones). Stage 0 is never omitted: it holds the
embedding and the head.

  python -m peer.evaluate --checkpoint DIR --omit 0.5 [--run NAME] [--json]
(also as `skippipe-coordinator eval`). Exit 0; 2 with a one-line error for unusable input.
"""
import argparse
import itertools
import json
import math
import random
import sys
from pathlib import Path

import torch

from swarmcore.cli.support import OneLineErrorParser
from peer.compute.model import lm_loss
from peer.compute.stage_checkpoint import CheckpointError, load_stage_modules
from peer.compute.stages import StageModule
from peer.data import CorpusError, TextDataset, load_corpus



class EvalError(Exception):
    """The checkpoint or flags cannot be evaluated (the message says why)."""


def load_stages(directory: Path, run: str | None) -> tuple[str, list[StageModule]]:
    """The run's stages from a checkpoint folder (either format; stage_checkpoint.py)."""
    try:
        run, stages, _ = load_stage_modules(directory, run)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    return run, stages


@torch.no_grad()
def perplexity(stages: list[StageModule], keep: tuple[int, ...], batches) -> float:
    """exp(mean token loss) through stage 0's embedding, the stages in `keep` (in order), the head."""
    total, count = 0.0, 0
    for tokens, targets in batches:
        hidden = stages[0].embed_tokens(tokens)
        for s in keep:
            hidden = stages[s](hidden)
        total += float(lm_loss(stages[0].logits(hidden), targets)) * targets.numel()
        count += targets.numel()
    return math.exp(total / count)


def choices(num_stages: int, omit: int, max_choices: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Sets of non-stage-0 stages to omit: all of them, or `max_choices` random ones."""
    middle = range(1, num_stages)
    if math.comb(num_stages - 1, omit) <= max_choices:
        return list(itertools.combinations(middle, omit))
    return [tuple(sorted(rng.sample(middle, omit))) for _ in range(max_choices)]


def evaluate(stages: list[StageModule], fraction: float, batches, max_choices: int = 32, seed: int = 0) -> dict:
    s = len(stages)
    omit = round(fraction * (s - 1))
    full = perplexity(stages, tuple(range(s)), batches)
    ppl = {}
    for gone in choices(s, omit, max_choices, random.Random(seed)):
        ppl[gone] = perplexity(stages, tuple(x for x in range(s) if x not in gone), batches)
    worst = max(ppl, key=ppl.get)
    mean = sum(ppl.values()) / len(ppl)
    return {"stages": s, "omitted": omit, "fraction": fraction, "choices": len(ppl), "ppl_all": full,
            "ppl_random_mean": mean, "ppl_worst": ppl[worst], "worst_omitted": list(worst),
            "random_vs_all": mean / full - 1, "worst_vs_all": ppl[worst] / full - 1}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-coordinator eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, metavar="DIR", help="a run's checkpoint folder (--checkpoint-dir)")
    p.add_argument("--omit", type=float, default=0.5, metavar="F", help="fraction of non-stage-0 stages to omit")
    p.add_argument("--run", help="which run's checkpoints, if the folder holds several")
    p.add_argument("--data", type=Path, help="text file or folder (default: the embedded corpus)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batches", type=int, default=16, help="held-out batches of 8 windows (default: 16)")
    p.add_argument("--max-choices", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    try:
        if not 0.0 <= args.omit <= 1.0:
            raise EvalError(f"--omit must be in [0, 1], got {args.omit}")
        if args.seq_len < 1 or args.batches < 1 or args.max_choices < 1:
            raise EvalError("--seq-len, --batches and --max-choices must be >= 1")
        run, stages = load_stages(args.checkpoint, args.run)
        if args.seq_len > stages[0].config.max_seq_len:
            raise EvalError(f"--seq-len {args.seq_len} exceeds the model's {stages[0].config.max_seq_len}")
        _, held_out = TextDataset(load_corpus(args.data)).split()
        batches = list(held_out.eval_batches(samples=8, seq_len=args.seq_len, max_batches=args.batches))
        if not batches:
            raise EvalError("the held-out part of the data is too small for one batch")
        result = {"run": run, **evaluate(stages, args.omit, batches, args.max_choices, args.seed)}
    except (EvalError, CorpusError) as exc:
        print(f"skippipe-coordinator eval: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(f"run {run}: {result['stages']} stages, omitting {result['omitted']} of {result['stages'] - 1} "
              f"non-stage-0 stages ({result['choices']} choices)\n"
              f"  perplexity, all stages:      {result['ppl_all']:.3f}\n"
              f"  perplexity, random omission: {result['ppl_random_mean']:.3f} ({100 * result['random_vs_all']:+.1f}%)\n"
              f"  perplexity, worst omission:  {result['ppl_worst']:.3f} ({100 * result['worst_vs_all']:+.1f}%, "
              f"stages {result['worst_omitted']} omitted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
