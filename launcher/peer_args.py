"""Each local peer's command line, built from its settings by skippipe-peer's own parser
declarations (swarmcore.cli.argv): a flag renamed there fails here at once, not in a peer's log."""
from dataclasses import dataclass
from pathlib import Path

from peer.cli import build_parser as peer_parser
from swarmcore.cli.argv import argv_for

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
PEER_LINGER_S = 60   # stay until the launcher stops them: a peer that leaves early can take its last report along


@dataclass(frozen=True)
class Emulation:
    """--topology: each peer's (node id, identity file), and the file naming every peer's node."""
    nodes: list[tuple[str, Path]]
    node_map: Path


def peer_settings(args, index: int, maddrs: list[str], emulation: Emulation | None = None,
                  run: str | None = None) -> dict:
    """skippipe-peer's settings ({dest: value}) for local peer `index` of the swarm `args` describes;
    `run`: what it passes to --run (the coordinator's NAME@KEY; default: the run's name)."""
    settings = {"initial_peers": maddrs, "run": run or args.run, "device": "cpu", "host_maddrs": [LOOPBACK],
                "log_level": args.log_level, "log_format": args.log_format, "public_name": f"local-{index}",
                "announce_period": args.announce_period, "linger": PEER_LINGER_S}
    if args.checkpoint_dir:
        settings.update(checkpoint_dir=args.checkpoint_dir, save_every=args.save_every, keep_last=args.keep_last)
    # off and auto are the coordinator's choice, carried by the schedule: the peers follow it
    # (their auto); int8/int4 force every link, so the peers get those
    forced = args.wire_compression if args.wire_compression in ("int8", "int4") else None
    settings.update(spot_check_rate=args.spot_check_rate or None, share_dtype=args.share_dtype,
                    wire_compression=forced, join_key=args.join_key or None)
    if emulation is not None:
        node_id, identity = emulation.nodes[index]
        # the planner reads the links from the topology file; a probe's 3 x 1 MiB each way
        # would only load the emulated links the run measures
        settings.update(identity=identity, topology=args.topology, node_id=node_id,
                        node_map=emulation.node_map, link_probe_period=0)
        stage = args.topology_data.nodes[index].stage
        if stage >= 0 and not args.chaos:
            settings["stage"] = stage
    if args.chaos:
        # equal peers must look equal to the planner, so that the victims have work: a
        # benchmark run by six peers at once on a loaded box can read one 8x slower
        settings.update(stage=index % args.stages, no_benchmark=True, fault=args.faults.get(index))
    return settings


def peer_argv(args, index: int, maddrs: list[str], emulation: Emulation | None = None,
              run: str | None = None) -> list[str]:
    return argv_for(peer_parser(), peer_settings(args, index, maddrs, emulation, run))
