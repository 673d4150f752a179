"""`python -m peer.benchmark_cli --model tiny --samples 4 --seq-len 64`: measure the one-layer
forward/backward benchmark afresh and store it in the cache that `skippipe-peer` reads at
start-up (peer/hardware.py), then print it.

`skippipe-swarm --topology` runs this once before its peers start: a dozen peers that each
benchmark at the same moment on a 2-core box read ~10x too slow (5.9 ms per layer and sample
against 0.6 ms idle), and the first one to finish wrote that into the cache that every later
run read, so the planner and its predictions saw compute that was not there.
"""
import sys
from pathlib import Path

from swarmcore.cli.support import OneLineErrorParser, folder_problem, positive_int

from peer.config import DEFAULT_CACHE_DIR


def build_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(prog="peer.benchmark_cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="model config name (default: tiny)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
    p.add_argument("--samples", type=positive_int, default=2, help="samples per microbatch (default: 2)")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sample (default: min(max_seq_len, 128))")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads, as the peer uses (default: 1)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help=f"(default: {DEFAULT_CACHE_DIR})")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = folder_problem(args.cache_dir, "--cache-dir")
    if problem:
        parser.error(problem)
    import torch
    from peer import hardware
    from modelconfig import ConfigError, resolve_model
    try:
        model = resolve_model(args.model)
    except ConfigError as exc:
        print(f"peer.benchmark_cli: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    seq_len = min(args.seq_len, model.max_seq_len) if args.seq_len else None   # as the peer clamps it
    bench = hardware.benchmark_layer(model, args.device, samples=args.samples, seq_len=seq_len,
                                     cache_dir=args.cache_dir, use_cache=False)
    print(f"layer benchmark ({model.name}, {bench.device}, {bench.samples}x{bench.seq_len}): forward "
          f"{1000 * bench.fwd_s_per_layer_sample:.3f} ms, backward {1000 * bench.bwd_s_per_layer_sample:.3f} ms "
          f"per layer and sample; cached in {args.cache_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
