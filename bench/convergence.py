"""Convergence with skipping (issue 6): loss curves for k = 0, 0.25 and 0.5 at equal tokens,
and the held-out perplexity with half of the non-stage-0 stages omitted at inference.

Each run trains the tiny model on the embedded corpus with the real pipeline worker and
handlers in one process (bench/support/memory_swarm.py: in-memory transport, no sockets;
timing plays no part here, only what is computed). Schedules come from the planner on a
single-cluster topology of --nodes nodes: k = 0 is the full pipeline (strategy full), k > 0 is
SkipPipe. Every run has the same data nodes, microbatches and iterations, so the same tokens.
Final held-out loss: the trained model with all stages in order (peer/evaluate.py). Then each
model is checkpointed per stage and `skippipe-coordinator eval --omit 0.5` measures it.

  python bench/convergence.py [--steps 120] [--out DIR]
Writes DIR/convergence.png. Last line: RESULT loss_k0=.. loss_k025=.. loss_k05=.. ...

  python bench/convergence.py --exchange-compare [--seeds 0 1 2]
SkipPipe (k = 1/3) with the replicas' synchronous exchange and with delayed updates
(RunSpec.gradient_exchange) at equal tokens, per seed; target (issue 26): delayed within 1% of
sync held-out loss. Last line: RESULT loss_sync=.. loss_delayed=.. delayed_vs_sync_pct=..
"""
import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from coordinator.planner import PlanConfig, PlannerConfig, plan
from coordinator.planner.presets import make_topology
from protocol import messages as m

from peer.data import TextDataset, load_corpus
from peer.evaluate import perplexity
from peer.pipeline.checkpoint import CheckpointStore
from peer.pipeline.worker import WorkerSettings
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.support
from bench.support.memory_swarm import batch_fn, run_memory_swarm  # noqa: E402

SKIPS = (0.0, 0.25, 0.5)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--data-nodes", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--share-dtype", choices=m.SHARE_DTYPES, default=WorkerSettings.share_dtype,
                   help="gradient shares between replicas (default: the peers' default, %(default)s)")
    p.add_argument("--out", type=Path, help="folder for the plot and checkpoints (default: a temporary one)")
    p.add_argument("--exchange-compare", action="store_true",
                   help="compare the synchronous exchange with delayed updates at k = 1/3 instead")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds for --exchange-compare")
    return p.parse_args()


def schedule_for(args, k: float):
    topo = make_topology("single", args.nodes, random.Random(args.seed), stages=args.stages, layers=6,
                         microbatch_samples=args.samples, microbatches=args.microbatches,
                         activation_bytes=args.seq_len * 64 * 4, memory=16)
    cfg = PlanConfig(strategy="full" if k == 0 else "skippipe", skip_ratio=k, run="conv",
                     planner=PlannerConfig(data_nodes=args.data_nodes))
    return plan(topo, cfg, args.seed)


def train(args, k: float, train_set: TextDataset, held_out, folder: Path, wire_compression: str = "off",
          gradient_exchange: str = "sync") -> dict:
    """`wire_compression`: what the peers send between hops (off: floats; int8/int4 on every
    link, bench/compression.py); `gradient_exchange`: RunSpec.gradient_exchange."""
    spec = m.RunSpec(run="conv", model="tiny", num_stages=args.stages, skip_ratio=k, seed=args.seed,
                     microbatch_samples=args.samples, seq_len=args.seq_len,
                     microbatches_per_origin=args.microbatches, learning_rate=args.lr, warmup_steps=5,
                     max_steps=args.steps, gradient_exchange=gradient_exchange)
    schedule = schedule_for(args, k)
    t0 = time.monotonic()
    workers = asyncio.run(run_memory_swarm(spec, schedule, batch_fn(spec, train_set), timeout=3600,
                                           share_dtype=args.share_dtype, wire_compression=wire_compression))
    origins = [w for w in workers.values() if w.seat.stage == 0]
    curve = [sum(w.ledger.history[i].loss_sum for w in origins) / sum(w.ledger.history[i].samples for w in origins)
             for i in range(args.steps)]
    tokens = sum(o.samples for w in origins for o in w.ledger.history) * args.seq_len
    by_stage = {w.seat.stage: w.seat.runner for w in workers.values()}   # replicas are identical after averaging
    store = CheckpointStore(folder, "conv")
    for stage, runner in by_stage.items():
        store.save(runner, stage, args.steps - 1)
    stages = [by_stage[s].module.eval() for s in range(args.stages)]
    loss = math.log(perplexity(stages, tuple(range(args.stages)), held_out))
    lost = sum(o.lost for w in origins for o in w.ledger.history)
    print(f"k={k} wire {wire_compression} exchange {gradient_exchange}: {len(schedule.routes)} microbatches/iteration, {tokens} tokens, train loss "
          f"{curve[0]:.3f} -> {curve[-1]:.3f}, held-out loss {loss:.4f}, lost {lost}, "
          f"{time.monotonic() - t0:.0f}s", flush=True)
    sent = {c: sum(w.sender.wire.sent[c] for w in workers.values()) for c in ("off", "int8", "int4")}
    return {"k": k, "curve": curve, "tokens": tokens, "held_out_loss": loss, "folder": folder, "sent": sent}


def evaluate(folder: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "coordinator.cli", "eval", "--checkpoint", str(folder),
                          "--omit", "0.5", "--json"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"eval of {folder} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def plot(results: list[dict], path: Path, seq_tokens_per_step: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        xs = [(i + 1) * seq_tokens_per_step for i in range(len(r["curve"]))]
        ax.plot(xs, r["curve"], label=f"k={r['k']} (held-out {r['held_out_loss']:.3f})")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("training loss")
    ax.set_title("tiny model, embedded corpus: full pipeline vs SkipPipe")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def compare_exchanges(args, train_set: TextDataset, held_out, out: Path) -> int:
    """Sync against delayed updates at k = 1/3, per seed, at equal tokens."""
    loss = {"sync": [], "delayed": []}
    for seed in args.seeds:
        args.seed = seed
        for mode in loss:
            r = train(args, 1 / 3, train_set, held_out, out / f"x-{mode}-s{seed}", gradient_exchange=mode)
            loss[mode].append(r["held_out_loss"])
        print(f"seed {seed}: held-out loss sync {loss['sync'][-1]:.4f}, delayed {loss['delayed'][-1]:.4f} "
              f"({100 * (loss['delayed'][-1] / loss['sync'][-1] - 1):+.2f}%)", flush=True)
    sync, delayed = (sum(v) / len(v) for v in (loss["sync"], loss["delayed"]))
    pct = [100 * (d / s - 1) for s, d in zip(loss["sync"], loss["delayed"])]
    print(f"RESULT loss_sync={sync:.4f} loss_delayed={delayed:.4f} delayed_vs_sync_pct={100 * (delayed / sync - 1):.2f} "
          f"pct_min={min(pct):.2f} pct_max={max(pct):.2f} seeds={len(pct)} steps={args.steps} "
          f"load={os.getloadavg()[0]:.1f}", flush=True)
    return 0


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="skippipe-conv-"))
    out.mkdir(parents=True, exist_ok=True)
    train_set, held = TextDataset(load_corpus()).split()
    held_out = list(held.eval_batches(samples=8, seq_len=args.seq_len, max_batches=16))
    if args.exchange_compare:
        return compare_exchanges(args, train_set, held_out, out)
    results = [train(args, k, train_set, held_out, out / f"k{k:g}") for k in SKIPS]
    assert len({r["tokens"] for r in results}) == 1, "runs saw different numbers of tokens"
    plot(results, out / "convergence.png", results[0]["tokens"] // args.steps)
    loss = {r["k"]: r["held_out_loss"] for r in results}
    evals = {k: evaluate(out / f"k{k:g}") for k in (0.0, 0.5)}
    for k, e in evals.items():
        print(f"eval k={k} model, {e['omitted']} of {e['stages'] - 1} stages omitted: perplexity "
              f"{e['ppl_all']:.3f} -> {e['ppl_random_mean']:.3f} random ({100 * e['random_vs_all']:+.1f}%), "
              f"{e['ppl_worst']:.3f} worst ({100 * e['worst_vs_all']:+.1f}%)", flush=True)
    print(f"plot: {out / 'convergence.png'}; k=0.25 vs k=0 held-out loss {100 * (loss[0.25] / loss[0.0] - 1):+.2f}% "
          f"(target within 5%)", flush=True)
    e0, e5 = evals[0.0], evals[0.5]
    print(f"RESULT loss_k0={loss[0.0]:.4f} loss_k025={loss[0.25]:.4f} loss_k05={loss[0.5]:.4f} "
          f"tokens={results[0]['tokens']} omit05_skip_ppl_all={e5['ppl_all']:.3f} "
          f"omit05_skip_ppl_random={e5['ppl_random_mean']:.3f} omit05_skip_ppl_worst={e5['ppl_worst']:.3f} "
          f"omit05_noskip_ppl_all={e0['ppl_all']:.3f} omit05_noskip_ppl_random={e0['ppl_random_mean']:.3f} "
          f"omit05_noskip_ppl_worst={e0['ppl_worst']:.3f} share_dtype={args.share_dtype}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
