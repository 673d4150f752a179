"""The torch side of `skippipe-coordinator export|generate` (coordinator/export_cli.py).

coordinator/ never imports peer/, so the coordinator parses and checks the flags, then runs

    python -m peer.hf_cli export|generate '<the parsed flags as one JSON object>'

and relays the exit code: 0, or 2 with a one-line error for unusable input (a checkpoint that
lacks a stage, a prompt the tokenizer cannot encode, ...).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from swarmcore.cli.support import fail_usage

PROG = "skippipe-coordinator"


class UsageError(Exception):
    pass


def cmd_export(a) -> int:
    from peer.compute.hf_export import parse_size
    max_shard = parse_size(a.max_shard_size)
    from peer.compute.hf_export import write_hf_folder
    if a.checkpoint is not None:
        from peer.compute.stage_checkpoint import load_stage_modules, recorded_tokenizer
        tokenizer = export_tokenizer(a.tokenizer, recorded_tokenizer(a.checkpoint, a.run))
        run, stages, iteration = load_stage_modules(a.checkpoint, a.run)
        source = f"run {run}, iteration {iteration}, {len(stages)} stages"
    else:
        from peer.live_export import pull_stages
        tokenizer = _tokenizer(a.tokenizer or "byte")
        stages, source = pull_stages(a.initial_peers, a.run, a.join_key)
    files = write_hf_folder(stages, tokenizer, a.output, max_shard)
    shards = [f for f in files if f.startswith("model") and f.endswith(".safetensors")]
    print(f"exported {source} -> {a.output} ({len(files)} files, weights in {len(shards)} safetensors "
          f"file{'s' if len(shards) > 1 else ''})")
    return 0


def export_tokenizer(requested: str | None, recorded: tuple[str, str] | None):
    """--tokenizer if given (it must be the one the checkpoint records), else the recorded one."""
    if not requested and recorded is not None and recorded[0] not in ("byte", "bpe"):
        raise UsageError(f"the run trained with tokenizer {recorded[0]}: pass that tokenizer.json with --tokenizer")
    tokenizer = _tokenizer(requested or (recorded[0] if recorded else "byte"))
    if recorded is not None and recorded[1] and tokenizer.hash != recorded[1]:
        raise UsageError(f"--tokenizer {requested} is not the tokenizer the run trained with ({recorded[0]}, "
                         f"sha256 {recorded[1][:12]})")
    return tokenizer


def _tokenizer(spec: str):
    from tokendata.tokenizer import TokenizerError, load_tokenizer
    try:
        return load_tokenizer(spec)
    except TokenizerError as exc:
        raise UsageError(f"--tokenizer: {exc}") from None


def _encode_prompt(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.encode(prompt)
    if not ids:
        raise UsageError("the prompt encodes to no tokens")
    back = tokenizer.decode(ids)
    if back != prompt:
        at = next((i for i, (x, y) in enumerate(zip(prompt, back)) if x != y), min(len(prompt), len(back)))
        raise UsageError(f"tokenizer {tokenizer.name} cannot encode the prompt (it differs from character {at}: "
                         f"{prompt[at:at + 10]!r})")
    return ids


def _check_fits(ids: list[int], tokenizer, config) -> None:
    if len(ids) >= config.max_seq_len:
        raise UsageError(f"the prompt is {len(ids)} tokens; the model's context is {config.max_seq_len}")
    if max(ids) >= config.vocab_size or tokenizer.vocab_size > config.vocab_size:
        raise UsageError(f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens, more than the model's "
                         f"vocab_size {config.vocab_size}: it is not this model's tokenizer")


def generate_tokenizer(a):
    """--tokenizer, else an exported folder's own tokenizer.json, else the one a checkpoint records,
    else the byte tokenizer."""
    own = a.checkpoint / "tokenizer.json"
    if own.is_file():
        return _tokenizer(a.tokenizer or str(own))
    from peer.compute.stage_checkpoint import CheckpointError, recorded_tokenizer
    try:
        recorded = recorded_tokenizer(a.checkpoint, getattr(a, "run", None))
    except CheckpointError:
        recorded = None        # the model loader says what is wrong with the folder
    return export_tokenizer(a.tokenizer, recorded)


def load_model(a):
    """A StagedModel from a checkpoint folder or an exported folder."""
    from peer.compute.hf_export import is_hf_folder, layer_split, load_hf_folder
    from peer.compute.sampling import StagedModel
    if is_hf_folder(a.checkpoint):
        model, split = load_hf_folder(a.checkpoint)
        if a.stages is not None:
            split = layer_split(model.config.n_layers, a.stages)
        if a.omit > 0 and not split:
            raise UsageError(f"{a.checkpoint} does not record its stage split: give --stages S for --omit")
        return StagedModel.from_decoder(model, split)
    from peer.compute.stage_checkpoint import load_stage_modules
    _, stages, _ = load_stage_modules(a.checkpoint, a.run)
    return StagedModel.from_stages(stages)


def cmd_generate(a) -> int:
    import torch
    from peer.compute.sampling import generate
    from peer.evaluate import choices
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    tokenizer = generate_tokenizer(a)
    ids = _encode_prompt(tokenizer, a.prompt)          # before the weights are read
    model = load_model(a)
    _check_fits(ids, tokenizer, model.config)
    s = model.num_stages
    omit = round(a.omit * (s - 1))
    gone = choices(s, omit, 1, random.Random(a.seed))[0] if omit else ()
    keep = [x for x in range(s) if x not in gone]
    if a.omit > 0:
        print(f"omitting stage(s) {list(gone) or 'none'} of {s} (keeping {keep})", file=sys.stderr)
    out = generate(model, ids, a.max_new_tokens, keep, temperature=a.temperature, top_p=a.top_p,
                   seed=a.seed, vocab_limit=tokenizer.vocab_size, eos_id=tokenizer.eos_id)
    print(tokenizer.decode(out))
    return 0


COMMANDS = {"export": cmd_export, "generate": cmd_generate}
PATHS = ("checkpoint", "output", "join_key")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] not in COMMANDS:
        return fail_usage(PROG, f"usage: python -m peer.hf_cli {{{','.join(COMMANDS)}}} '<flags as JSON>'")
    flags = json.loads(argv[1])
    a = argparse.Namespace(**{k: Path(v) if k in PATHS and v is not None else v for k, v in flags.items()})
    from peer.compute.hf_export import ExportError
    from peer.compute.stage_checkpoint import CheckpointError
    try:
        return COMMANDS[argv[0]](a)
    except (UsageError, ExportError, CheckpointError) as exc:
        return fail_usage(f"{PROG} {argv[0]}", str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
