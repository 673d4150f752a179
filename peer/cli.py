"""`skippipe-peer`: join a SkipPipe swarm and serve one pipeline stage."""
import argparse
import logging
import sys
from pathlib import Path

from protocol.cli_support import EXIT_USAGE, OneLineErrorParser, positive_int
from protocol.ids import check_run_name

from peer.chaos import FaultSpecError, parse_faults
from peer.config import STAGE_AUTO, PeerConfig

DESCRIPTION = """\
Join a SkipPipe Swarm training run as a volunteer peer.

The peer joins the hivemind DHT through --initial-peers (the multiaddr printed by
skippipe-coordinator), benchmarks its device, announces itself, and then hosts the stage the
coordinator assigns (or --stage K). It forwards activations and gradients to other peers
along the coordinator's SkipPipe routes. Stop it with Ctrl-C: it announces OFFLINE first.
"""

EPILOG = """\
example:
  skippipe-peer --gpu 0 --initial-peers /ip4/203.0.113.5/tcp/31337/p2p/QmCoordinator
  skippipe-peer --device cpu --stage 2 --run demo --initial-peers /ip4/127.0.0.1/tcp/4000/p2p/Qm...
"""


def stage_arg(text: str) -> int:
    if text == "auto":
        return STAGE_AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a stage number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"stage must be >= 0, got {value}")
    return value


def run_name(text: str) -> str:
    try:
        return check_run_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-peer", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--gpu", type=int, metavar="N", help="use CUDA device N")
    dev.add_argument("--device", default="cpu", help="torch device when --gpu is not given (default: cpu)")
    p.add_argument("--initial-peers", nargs="+", required=True, metavar="MADDR",
                   help="multiaddr(s) of a running coordinator or peer, as printed by skippipe-coordinator")
    p.add_argument("--run", type=run_name, default="default", help="training run to join (default: default)")
    p.add_argument("--stage", type=stage_arg, default=STAGE_AUTO, metavar="auto|K",
                   help="pipeline stage to host; 'auto' lets the coordinator choose (default)")
    p.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR",
                   help="where to listen (default: all IPv4 interfaces, random TCP port)")
    p.add_argument("--announce-maddrs", nargs="+", default=[], metavar="MADDR",
                   help="public addresses to advertise, if behind NAT with a forwarded port")
    p.add_argument("--data", type=Path, help="text file or folder of .txt files (default: embedded corpus)")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "skippipe",
                   help="where benchmark results are cached (default: ~/.cache/skippipe)")
    p.add_argument("--checkpoint-dir", type=Path, help="save this stage's state here each iteration and resume from it")
    p.add_argument("--max-activations", type=positive_int, default=8, metavar="N",
                   help="microbatch activations held for backward at once (default: 8)")
    p.add_argument("--announce-period", type=float, default=1.5, metavar="S",
                   help="seconds between adverts; they expire after twice this (default: 1.5)")
    p.add_argument("--status-interval", type=float, default=10.0, metavar="S",
                   help="seconds between one-line status prints (default: 10)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--public-name", default="", help="a name shown to other people in the swarm")
    p.add_argument("--no-benchmark", action="store_true", help="skip the start-up layer benchmark")
    p.add_argument("--identity", type=Path, metavar="FILE",
                   help="keep this peer's key (its peer id) in FILE, created with mode 0600 if missing "
                        "(default: a new identity each start)")
    p.add_argument("--join-key", type=Path, metavar="FILE", help="the run's join secret, if it requires one")
    p.add_argument("--max-requests-per-s", type=float, default=100.0, metavar="R",
                   help="requests per second accepted from one peer before answering OVERLOADED (default: 100)")
    p.add_argument("--fault", type=fault_spec, default="", metavar="SPEC",
                   help="testing only: inject faults, e.g. kill@3:backward or stall@5:10 (see peer/chaos.py)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def fault_spec(text: str) -> str:
    try:
        parse_faults(text)
    except FaultSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def config_from_args(args: argparse.Namespace) -> PeerConfig:
    device = f"cuda:{args.gpu}" if args.gpu is not None else args.device
    return PeerConfig(
        initial_peers=tuple(args.initial_peers), run=args.run, device=device, stage=args.stage,
        host_maddrs=tuple(args.host_maddrs), announce_maddrs=tuple(args.announce_maddrs),
        data=args.data, cache_dir=args.cache_dir, checkpoint_dir=args.checkpoint_dir,
        announce_period_s=args.announce_period, max_activations=args.max_activations,
        status_interval_s=args.status_interval, torch_threads=args.threads,
        public_name=args.public_name, benchmark=not args.no_benchmark,
        identity_path=args.identity, join_key_path=args.join_key, max_requests_per_s=args.max_requests_per_s,
        fault=args.fault,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    config = config_from_args(args)
    from peer.app import run_peer  # heavy imports (torch, hivemind) only after the flags are valid
    return run_peer(config)


if __name__ == "__main__":
    sys.exit(main())
