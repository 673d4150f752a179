"""`export` and `generate` subcommands (wired into coordinator/cli.py).

    skippipe-coordinator export --checkpoint DIR -o OUT [--tokenizer byte|bpe|FILE] [--max-shard-size 5GB]
    skippipe-coordinator generate --checkpoint DIR_OR_HF_DIR --prompt TEXT [--max-new-tokens N]
                                  [--temperature T] [--top-p P] [--seed S] [--omit F]

Flags are parsed and checked here (one-line error, exit 2, before torch is even imported);
the model work runs in `python -m peer.hf_cli` (torch side), as eval does, because
coordinator/ never imports peer/. Its exit code and output come back unchanged.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from swarmcore.cli.support import fail_usage

PROG = "skippipe-coordinator"
SIZE_UNITS = ("B", "KB", "MB", "GB", "KIB", "MIB", "GIB")


class FlagError(Exception):
    pass


def check_size(text: str) -> None:
    t = text.strip().upper()
    unit = next((u for u in sorted(SIZE_UNITS, key=len, reverse=True) if t.endswith(u)), "")
    try:
        ok = float(t[:len(t) - len(unit)]) > 0
    except ValueError:
        ok = False
    if not ok:
        raise FlagError(f"--max-shard-size: not a size: {text!r} (e.g. 5GB, 500MB)")


def check_export(a) -> None:
    check_size(a.max_shard_size)
    if (a.checkpoint is None) == (not a.initial_peers):
        raise FlagError("give exactly one of --checkpoint DIR and --initial-peers MADDR")
    if a.initial_peers and not a.run:
        raise FlagError("--initial-peers needs --run NAME")
    if a.checkpoint is not None and not a.checkpoint.is_dir():
        raise FlagError(f"--checkpoint {a.checkpoint} is not a folder")
    if a.output.exists() and (not a.output.is_dir() or any(a.output.iterdir())):
        raise FlagError(f"-o {a.output} exists and is not an empty folder")


def check_generate(a) -> None:
    if a.max_new_tokens < 1:
        raise FlagError(f"--max-new-tokens must be >= 1, got {a.max_new_tokens}")
    if not a.temperature >= 0:
        raise FlagError(f"--temperature must be >= 0, got {a.temperature}")
    if not 0 < a.top_p <= 1:
        raise FlagError(f"--top-p must be in (0, 1], got {a.top_p}")
    if not 0 <= a.omit <= 1:
        raise FlagError(f"--omit must be in [0, 1], got {a.omit}")
    if a.stages is not None and a.stages < 1:
        raise FlagError(f"--stages must be >= 1, got {a.stages}")
    if not a.prompt:
        raise FlagError("--prompt is empty")
    if not a.checkpoint.is_dir():
        raise FlagError(f"--checkpoint {a.checkpoint} is not a folder")


def relay(command: str, check, keys: tuple[str, ...]):
    def run(args) -> int:
        try:
            check(args)
        except FlagError as exc:
            return fail_usage(f"{PROG} {command}", str(exc))
        flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k in keys}
        try:
            return subprocess.run([sys.executable, "-m", "peer.hf_cli", command, json.dumps(flags)]).returncode
        except KeyboardInterrupt:
            return 130
    return run


EXPORT_KEYS = ("checkpoint", "initial_peers", "run", "output", "tokenizer", "max_shard_size", "join_key")
GENERATE_KEYS = ("checkpoint", "prompt", "max_new_tokens", "temperature", "top_p", "seed", "omit", "run",
                 "tokenizer", "stages")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write a run's model as a Hugging Face folder (transformers loads it)",
        description="Write a run's per-stage checkpoints (or a live run's current weights) as a Hugging Face "
                    "LlamaForCausalLM folder: config.json, model.safetensors (sharded when large), "
                    "generation_config.json, tokenizer.json and tokenizer_config.json.")
    p.add_argument("--checkpoint", type=Path, metavar="DIR", help="a run's checkpoint folder (--checkpoint-dir)")
    p.add_argument("--initial-peers", nargs="+", default=[], metavar="MADDR",
                   help="instead of --checkpoint: pull every stage's current weights from a live run's peers")
    p.add_argument("--run", help="which run (if the folder holds several; required with --initial-peers, "
                                 "where NAME@KEY accepts only that organiser key, as peers do)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUT", help="folder to write (new or empty)")
    p.add_argument("--tokenizer", help="the run's tokenizer: byte, bpe or a tokenizer.json (default: the one the "
                                       "checkpoint records, else byte)")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                   help="largest model.safetensors shard, e.g. 500MB (default: 5GB)")
    p.add_argument("--join-key", type=Path, metavar="FILE", help="with --initial-peers: the run's join secret")
    p.set_defaults(func=relay("export", check_export, EXPORT_KEYS))

    g = subparsers.add_parser(
        "generate", help="sample a continuation from a checkpoint or an exported folder",
        description="Continue a prompt with the trained model (this project's own model code), through every "
                    "stage or with a fraction of the non-stage-0 stages omitted, as SkipPipe trains it.")
    g.add_argument("--checkpoint", type=Path, required=True, metavar="DIR",
                   help="a run's checkpoint folder or a folder written by `export`")
    g.add_argument("--prompt", required=True, help="text to continue")
    g.add_argument("--max-new-tokens", type=int, default=100, metavar="N", help="(default: 100)")
    g.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default: 0.8)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P", help="nucleus sampling mass (default: 0.95)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed; also picks the omitted stages (default: 0)")
    g.add_argument("--omit", type=float, default=0.0, metavar="F",
                   help="leave out round(F x (S-1)) of the S-1 non-stage-0 stages (default: 0)")
    g.add_argument("--run", help="which run, if the checkpoint folder holds several")
    g.add_argument("--tokenizer", help="byte, bpe or a tokenizer.json (default: an exported folder's own, else byte)")
    g.add_argument("--stages", type=int, metavar="S",
                   help="for --omit on a Hugging Face folder that does not record its stage split: S even stages")
    g.set_defaults(func=relay("generate", check_generate, GENERATE_KEYS))
