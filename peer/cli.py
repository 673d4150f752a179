"""`skippipe-peer`: join a SkipPipe swarm and serve one pipeline stage."""
import argparse
import sys
from pathlib import Path

from opsweb.addresses import multiaddr
from swarmcore.cli.support import (EXIT_USAGE, OneLineErrorParser, add_version_flag, folder_problem,
                                  positive_int, run_address, run_name)
from protocol.messages import SHARE_BLOCK, SHARE_DTYPES
from swarmcore.cli.logsetup import add_logging_flags, setup_logging
from swarmcore.cli.run_flags import add_wire_compression
from swarmcore.cli.settings import add_config_flag, apply_settings, port_or_off
from swarmcore.relay import RelayConfigError, relay_kwargs

from peer.chaos import FaultSpecError, parse_faults
from peer.config import DEFAULT_CACHE_DIR, STAGE_AUTO, PeerConfig

WIRE_CHOICES = ("auto", "float32", "bfloat16", "float16")   # = peer.compute.precision's (no torch here)

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


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_rate(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_s(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def rate_0_1(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _device_flags(p: argparse.ArgumentParser) -> None:
    """Where compute runs and what travels."""
    g = p.add_argument_group("device and wire")
    dev = g.add_mutually_exclusive_group()
    dev.add_argument("--gpu", type=int, metavar="N", help="use CUDA device N")
    dev.add_argument("--device", default="cpu",
                     help="torch device when --gpu is not given: cpu, cuda:N, or mps on Apple silicon (default: cpu)")
    g.add_argument("--max-vram", type=vram_size, default=0, metavar="SIZE",
                   help="GPU memory this peer may use, e.g. 12GB (default: the whole GPU); reserved at start")
    g.add_argument("--wire-dtype", choices=WIRE_CHOICES, default="auto",
                   help="dtype of activations sent to other peers (default auto: bfloat16 on GPU, float32 on CPU)")
    g.add_argument("--share-dtype", choices=SHARE_DTYPES, default=PeerConfig.share_dtype,
                   help="dtype of the gradients replicas of a stage exchange each iteration: float32 exact, "
                        f"float16 half the bytes, int8 about a quarter (blockwise quantised, a scale per {SHARE_BLOCK} "
                        "values); all replicas still end bit-identical (default: %(default)s)")
    add_wire_compression(g)     # declared once for the peer, the coordinator and the swarm


def _swarm_flags(p: argparse.ArgumentParser) -> None:
    """Which swarm and run, where to listen, which stage."""
    g = p.add_argument_group("joining a swarm")
    g.add_argument("--initial-peers", type=multiaddr, nargs="+", required=True, metavar="MADDR",
                   help="multiaddr(s) of a running coordinator or peer, as printed by skippipe-coordinator")
    g.add_argument("--run", type=run_address, default=("default", ""), metavar="NAME[@KEY]",
                   help="training run to join, as the coordinator prints it: NAME@KEY accepts the run's spec and "
                        "schedules only when signed by that organiser key; a plain NAME trusts the first key it "
                        "sees (default: default)")
    g.add_argument("--stage", type=stage_arg, default=STAGE_AUTO, metavar="auto|K",
                   help="pipeline stage to host; 'auto' lets the coordinator choose (default)")
    g.add_argument("--host-maddrs", type=multiaddr, nargs="+", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR",
                   help="where to listen (default: all IPv4 interfaces, random TCP port)")
    g.add_argument("--announce-maddrs", type=multiaddr, nargs="+", default=[], metavar="MADDR",
                   help="public addresses to advertise, if behind NAT with a forwarded port")
    relay = g.add_mutually_exclusive_group()
    relay.add_argument("--relay-via", type=multiaddr, nargs="+", default=[], metavar="MADDR",
                       help="behind NAT without a forwarded port: reserve a slot on these relays (public peers or a "
                            "coordinator started with --serve-relay; full addresses with /p2p/<id>) and advertise "
                            "/p2p-circuit addresses through them; give 4 or more, libp2p waits ~3 minutes with fewer")
    relay.add_argument("--serve-relay", action="store_true",
                       help="this peer has a public address: relay connections for peers behind NAT (docs/nat.md)")


def _data_flags(p: argparse.ArgumentParser) -> None:
    """Training data, caches and checkpoints."""
    g = p.add_argument_group("data and checkpoints")
    g.add_argument("--data", type=data_path, metavar="PATH",
                   help="a dataset folder built by `skippipe-coordinator data` (its manifest and hashes are checked), "
                        "or a text file or folder of .txt files as bytes (default: the embedded corpus)")
    g.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                   help="where benchmark results are cached (default: ~/.cache/skippipe)")
    g.add_argument("--checkpoint-dir", type=Path,
                   help="save this stage's state here (safetensors weights + optimizer state) and resume from it")
    g.add_argument("--save-every", type=positive_int, default=PeerConfig.save_every, metavar="N",
                   help="with --checkpoint-dir: save after every N-th iteration and the last (default: %(default)s)")
    g.add_argument("--keep-last", type=positive_int, default=PeerConfig.keep_last, metavar="K",
                   help="with --checkpoint-dir: keep the K newest checkpoints of the stage (default: %(default)s)")


def _runtime_flags(p: argparse.ArgumentParser) -> None:
    """Memory, timing and reporting while training."""
    g = p.add_argument_group("running")
    g.add_argument("--max-activations", type=positive_int, default=8, metavar="N",
                   help="microbatch activations held for backward at once (default: 8)")
    g.add_argument("--announce-period", type=float, default=1.5, metavar="S",
                   help="seconds between adverts; they expire after twice this, and the schedule and the other "
                        "peers' adverts are read every half of it, at most once a second (default: 1.5)")
    g.add_argument("--linger", type=float, default=5.0, metavar="S",
                   help="seconds to stay after the run's last iteration, serving and re-publishing the last "
                        "progress report so the coordinator sees the end (default: 5; skippipe-swarm, which "
                        "stops its peers itself, gives 60)")
    g.add_argument("--status-interval", type=float, default=10.0, metavar="S",
                   help="seconds between one-line status prints (default: 10)")
    g.add_argument("--link-probe-period", type=non_negative_s, default=30.0, metavar="S",
                   help="seconds between link probes (RTT and bandwidth to every other peer, for the planner); "
                        "0 turns them off, e.g. when the links are emulated from a topology file (default: 30)")
    g.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default: 1)")
    g.add_argument("--public-name", default="", help="a name shown to other people in the swarm")
    g.add_argument("--no-benchmark", action="store_true", help="skip the start-up layer benchmark")


def _security_flags(p: argparse.ArgumentParser) -> None:
    """Identity, admission and abuse limits."""
    g = p.add_argument_group("identity and security")
    g.add_argument("--identity", type=Path, metavar="FILE",
                   help="keep this peer's key (its peer id) in FILE, created with mode 0600 if missing "
                        "(default: a new identity each start)")
    g.add_argument("--join-key", type=Path, metavar="FILE", help="the run's join secret, if it requires one")
    g.add_argument("--invite", default="", metavar="TOKEN",
                   help="the invitation the organiser gave you (skippipe-coordinator invite); it pins the run's "
                        "organiser key, and binds to this peer's identity (keep it with --identity)")
    g.add_argument("--max-requests-per-s", type=positive_rate, default=100.0, metavar="R",
                   help="requests per second accepted from one peer before answering OVERLOADED (default: 100)")
    g.add_argument("--spot-check-rate", type=rate_0_1, default=0.0, metavar="F",
                   help="share of the forwards we send that another replica recomputes, with their backwards, to catch "
                        "peers returning wrong activations or gradients (0..1; default: 0, off; see docs/security.md, "
                        "\"Wrong results\")")


def _testing_flags(p: argparse.ArgumentParser) -> None:
    """Fault injection, metrics and emulation (testing and operations)."""
    g = p.add_argument_group("metrics and testing")
    g.add_argument("--fault", type=fault_spec, default="", metavar="SPEC",
                   help="testing only: inject faults, e.g. kill@3:backward, stall@5:10, corrupt@2, badgrad@2 or hang@4:20 "
                        "(see peer/chaos.py)")
    g.add_argument("--metrics-port", type=port_or_off, default=None, metavar="PORT|off",
                   help="serve Prometheus /metrics and /api/status on this port (0: any free port; default: off)")
    g.add_argument("--metrics-host", default="127.0.0.1",
                   help="address for --metrics-port (default: 127.0.0.1; 0.0.0.0 to expose it)")
    g.add_argument("--topology", type=Path, metavar="FILE",
                   help="testing: emulate the links and compute slowdown of this topology file (needs --node-id)")
    g.add_argument("--node-id", default="", metavar="ID", help="which node of --topology this peer is")
    g.add_argument("--node-map", type=Path, metavar="FILE",
                   help="JSON {peer id: node id} naming the other peers' nodes (skippipe-swarm writes it)")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-peer", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _device_flags(p)
    _swarm_flags(p)
    _data_flags(p)
    _runtime_flags(p)
    _security_flags(p)
    _testing_flags(p)
    add_logging_flags(p, "INFO")
    add_config_flag(p)
    add_version_flag(p)
    return p


def vram_size(text: str) -> int:
    from peer.compute.device import parse_vram
    try:
        return parse_vram(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def data_path(text: str) -> Path:
    """--data: must exist; a dataset folder's manifest and shard sizes are checked now (cheap),
    its sha256s when the peer starts."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or folder")
    from tokendata.manifest import MANIFEST, DatasetError, verify_dataset  # torch-free, unlike peer.data
    if (path / MANIFEST).is_file():
        try:
            verify_dataset(path, check_hashes=False)
        except DatasetError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return path


def fault_spec(text: str) -> str:
    try:
        parse_faults(text)
    except FaultSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def invited_key(token: str, pinned: str) -> str:
    """The organiser key to pin: --run NAME@KEY's, or else the invitation's; both must agree."""
    if not token:
        return pinned
    from protocol.invitations import InvitationError, parse_token
    try:
        key = parse_token(token).organiser_key
    except InvitationError as exc:
        raise argparse.ArgumentTypeError(f"--invite: {exc}") from None
    if pinned and pinned != key:
        raise argparse.ArgumentTypeError("--invite is for another organiser key than --run NAME@KEY names")
    return key


def config_from_args(args: argparse.Namespace) -> PeerConfig:
    from peer.compute.device import parse_device  # torch: only once the flags parsed
    device = str(parse_device(args.gpu, args.device))
    organiser_key = invited_key(args.invite, args.run[1])
    try:
        relay_kwargs(tuple(args.relay_via), args.serve_relay)
    except RelayConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return PeerConfig(
        initial_peers=tuple(args.initial_peers), run=args.run[0], organiser_key=organiser_key, invite=args.invite,
        device=device, stage=args.stage,
        host_maddrs=tuple(args.host_maddrs), announce_maddrs=tuple(args.announce_maddrs),
        relay_via=tuple(args.relay_via), serve_relay=args.serve_relay,
        data=args.data, cache_dir=args.cache_dir, checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every, keep_last=args.keep_last,
        announce_period_s=args.announce_period, max_activations=args.max_activations,
        status_interval_s=args.status_interval, linger_s=args.linger, link_probe_period_s=args.link_probe_period, torch_threads=args.threads,
        public_name=args.public_name, benchmark=not args.no_benchmark,
        identity_path=args.identity, join_key_path=args.join_key, max_requests_per_s=args.max_requests_per_s,
        fault=args.fault, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        topology=args.topology, node_id=args.node_id, node_map=args.node_map,
        max_vram_bytes=args.max_vram, wire_dtype=args.wire_dtype, share_dtype=args.share_dtype,
        spot_check_rate=args.spot_check_rate, wire_compression=args.wire_compression,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    apply_settings(parser, argv, "peer")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    from peer.compute.device import DeviceError, check_device
    try:  # a missing, busy or out-of-range GPU: one line and exit 2, before joining anything
        config = config_from_args(args)
        check_device(config.device, config.max_vram_bytes)
    except (DeviceError, argparse.ArgumentTypeError) as exc:
        print(f"skippipe-peer: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for flag, folder in (("--cache-dir", args.cache_dir if not args.no_benchmark else None),
                         ("--checkpoint-dir", args.checkpoint_dir)):
        problem = folder is not None and folder_problem(folder, flag)
        if problem:
            parser.error(problem)
    if bool(args.topology) != bool(args.node_id):
        parser.error("--topology and --node-id go together (which node of the topology is this peer?)")
    from peer.app import run_peer  # heavy imports (torch, hivemind) only after the flags are valid
    if args.log_format == "json":  # hivemind's own colored handler would bypass the JSON one
        from hivemind.utils.logging import use_hivemind_log_handler
        use_hivemind_log_handler("nowhere")
    return run_peer(config)


if __name__ == "__main__":
    sys.exit(main())
