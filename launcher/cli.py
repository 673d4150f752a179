"""`skippipe-swarm`: a whole local swarm (coordinator + N peers) on this machine, on 127.0.0.1.
`python -m launcher` runs it too."""
import argparse
import sys
from pathlib import Path

from opsweb.stopping import run_until_stopped
from protocol.errors import ProtocolError
from protocol.messages import SHARE_DTYPES
from protocol.topology import load_topology
from swarmcore.cli.logsetup import add_logging_flags, setup_logging
from swarmcore.cli.run_flags import LAUNCHER, add_run_flags
from swarmcore.cli.settings import add_config_flag, apply_settings
from swarmcore.cli.support import OneLineErrorParser, add_version_flag, fail_usage, positive_int

from coordinator.run_args import print_path_length, resolve_arch, resolve_data_or_exit

from launcher.chaos_spec import ChaosSpecError, parse_chaos
from launcher.fork_server import start_mode
from launcher.swarm import run_swarm

DESCRIPTION = """\
Start a complete SkipPipe swarm on this machine: a coordinator and N volunteer peers as
separate processes talking over real hivemind P2P on 127.0.0.1. It trains the chosen model
on the embedded Shakespeare corpus, shows progress, prints a summary, and stops every
process it started. The peers are forked from one process that imported torch and hivemind
once, which starts them seconds sooner on a small machine; SKIPPIPE_LOCAL_PEERS=exec starts
each as a fresh `python -m peer.cli` instead.
"""
EPILOG = "example:\n  skippipe-swarm --peers 6 --stages 3 --steps 20 --skip 1/3 --model tiny\n"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-swarm", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=positive_int, default=6, help="number of peer processes (default: 6)")
    add_run_flags(p, LAUNCHER)   # shared with skippipe-coordinator run (swarmcore/cli/run_flags.py)
    p.add_argument("--save-every", type=positive_int, default=1, metavar="N",
                   help="with --checkpoint-dir: save after every N-th iteration and the last (default: 1)")
    p.add_argument("--keep-last", type=positive_int, default=2, metavar="K",
                   help="with --checkpoint-dir: checkpoints kept per stage (default: 2)")
    p.add_argument("--summary-json", type=Path, metavar="FILE", help="write the run summary as JSON")
    p.add_argument("--logs-dir", type=Path, help="keep peer logs here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds (default: 900)")
    p.add_argument("--announce-period", type=float, default=1.5, metavar="S",
                   help="peers' advert period; a peer is taken as departed after twice this (default: 1.5; "
                        "raise it on a heavily loaded machine, where late adverts look like departures)")
    p.add_argument("--switch-margin", type=float, default=4.0, metavar="S",
                   help="a new schedule epoch takes effect this many seconds of iterations after it is published, "
                        "so that every peer has read it by then (default: 4; lower re-plans sooner)")
    p.add_argument("--topology", type=Path, metavar="T.json",
                   help="emulate this topology file's links and compute slowdowns (one peer per node; "
                        "--peers defaults to its node count); the coordinator plans with its links")
    p.add_argument("--chaos", default="", metavar="SPEC",
                   help="inject faults to watch recovery, e.g. kill:1@iter3,stall:2@iter5 (peer index, "
                        "iteration; kill:P@iterN:backward kills mid-backward; corrupt:P@iterN sends wrong "
                        "activations; lie:P@iterN:F makes its advert claim an F times faster measured speed; "
                        "hang:P@iterN:S makes it drop the forwards it takes for S seconds, default 20; "
                        "pause:P@iterN:S stops the peer with SIGSTOP for S seconds, default 15). Peers then get stages round-robin (peer P hosts stage P mod --stages) "
                        "so you know whom you hit, and skip the layer benchmark (all equally fast to "
                        "the planner; --topology slowdowns still apply)")
    p.add_argument("--share-dtype", choices=SHARE_DTYPES, default=None,
                   help="every peer's --share-dtype: the gradients replicas exchange each iteration "
                        "(default: the peers' own default)")
    p.add_argument("--spot-check-rate", type=float, default=0.0, metavar="F",
                   help="every peer's --spot-check-rate: share of forwards recomputed on another replica "
                        "(default: 0, off)")
    add_logging_flags(p, "WARNING")
    add_config_flag(p)
    add_version_flag(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    apply_settings(parser, argv, "swarm")
    args = parser.parse_args(argv)
    if not 0.5 <= args.switch_margin <= 600:
        return fail_usage("skippipe-swarm", f"--switch-margin must be between 0.5 and 600 seconds, got {args.switch_margin}")
    if not args.announce_period > 0:
        return fail_usage("skippipe-swarm", f"--announce-period must be > 0, got {args.announce_period}")
    args.topology_data = None
    if args.topology is not None:
        try:
            args.topology_data = load_topology(args.topology)
        except ProtocolError as exc:
            return fail_usage("skippipe-swarm", f"--topology: {exc}")
        nodes = len(args.topology_data.nodes)
        if any(a == "--peers" or a.startswith("--peers=") for a in argv) and args.peers != nodes:
            return fail_usage("skippipe-swarm", f"--topology has {nodes} nodes, one per peer, but --peers is {args.peers}")
        args.peers = nodes
    if not 0.0 <= args.spot_check_rate <= 1.0:
        return fail_usage("skippipe-swarm", f"--spot-check-rate must be between 0 and 1, got {args.spot_check_rate}")
    try:
        start_mode()
    except ValueError as exc:
        return fail_usage("skippipe-swarm", str(exc))
    args.run_data = resolve_data_or_exit("skippipe-swarm", args)
    failed = resolve_arch("skippipe-swarm", args, args.run_data.vocab_size)
    if failed is not None:
        return failed
    if args.stages > args.peers:
        return fail_usage("skippipe-swarm", f"--stages {args.stages} needs at least as many --peers (got {args.peers})")
    try:
        args.faults, args.pauses = parse_chaos(args.chaos, args.peers)
    except ChaosSpecError as exc:
        return fail_usage("skippipe-swarm", str(exc))
    setup_logging(args.log_level, args.log_format)
    print_path_length(args)
    return run_until_stopped(lambda stop: run_swarm(args, stop), "the swarm")


if __name__ == "__main__":
    sys.exit(main())
