"""skippipe-swarm builds each peer's command line from skippipe-peer's parser declarations
(launcher/peer_args.py, swarmcore/cli/argv.py): the peers get exactly the settings the
launcher meant, as the hand-written command lines did."""
import argparse
from types import SimpleNamespace

import pytest

from launcher import cli as swarm_cli
from launcher.peer_args import Emulation, peer_argv
from peer.cli import build_parser as peer_parser
from swarmcore.cli.argv import UnknownSetting, argv_for

MADDRS = ["/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"]


def swarm_args(*argv: str) -> argparse.Namespace:
    args = swarm_cli.build_parser().parse_args(list(argv))
    args.topology_data, args.faults = None, {}
    return args


def parsed(argv: list[str]) -> argparse.Namespace:
    return peer_parser().parse_args(argv)


BASE = ["--initial-peers", *MADDRS, "--run", "local", "--device", "cpu", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
        "--log-level", "WARNING", "--log-format", "text", "--public-name", "local-1",
        "--announce-period", "1.5", "--linger", "60"]


def test_a_plain_swarm_peer_gets_what_the_hand_written_line_gave():
    assert parsed(peer_argv(swarm_args(), 1, MADDRS)) == parsed(BASE)


def test_checkpoints_join_key_spot_checks_and_share_dtype_reach_the_peer(tmp_path):
    key = tmp_path / "join.key"
    args = swarm_args("--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "3", "--keep-last", "4",
                      "--join-key", str(key), "--spot-check-rate", "0.25", "--share-dtype", "float16")
    expected = BASE + ["--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "3", "--keep-last", "4",
                       "--spot-check-rate", "0.25", "--share-dtype", "float16", "--join-key", str(key)]
    assert parsed(peer_argv(args, 1, MADDRS)) == parsed(expected)


def test_chaos_pins_stages_skips_the_benchmark_and_hands_out_faults():
    args = swarm_args("--chaos", "kill:1@iter3", "--stages", "2", "--peers", "4")
    args.faults = {1: "kill@3"}
    victim, bystander = parsed(peer_argv(args, 1, MADDRS)), parsed(peer_argv(args, 2, MADDRS))
    assert (victim.stage, victim.no_benchmark, victim.fault) == (1, True, "kill@3")
    assert (bystander.stage, bystander.no_benchmark, bystander.fault) == (0, True, "")


def test_an_emulated_peer_gets_its_node_identity_and_no_link_probes(tmp_path):
    args = swarm_args("--topology", str(tmp_path / "t.json"))
    args.topology_data = SimpleNamespace(nodes=[SimpleNamespace(stage=0), SimpleNamespace(stage=-1)])   # pinned, free
    emulation = Emulation([("a", tmp_path / "a.key"), ("b", tmp_path / "b.key")], tmp_path / "map.json")
    expected = BASE + ["--identity", str(tmp_path / "b.key"), "--topology", str(tmp_path / "t.json"),
                       "--node-id", "b", "--node-map", str(tmp_path / "map.json"), "--link-probe-period", "0"]
    assert parsed(peer_argv(args, 1, MADDRS, emulation)) == parsed(expected)
    first = parsed(peer_argv(args, 0, MADDRS, emulation))
    assert first.stage == 0 and first.node_id == "a"


def test_argv_for_names_flags_by_their_declarations():
    parser = peer_parser()
    assert argv_for(parser, {"initial_peers": MADDRS, "no_benchmark": True, "stage": None}) == \
        ["--initial-peers", *MADDRS, "--no-benchmark"]
    assert argv_for(parser, {"initial_peers": MADDRS, "no_benchmark": False}) == ["--initial-peers", *MADDRS]
    with pytest.raises(UnknownSetting, match="no_such_flag"):
        argv_for(parser, {"no_such_flag": 1})


def test_the_run_flags_are_declared_once_for_coordinator_and_launcher():
    from coordinator import cli as coordinator_cli
    from swarmcore.cli.run_flags import LAUNCHER_DEFAULTS
    run = coordinator_cli.subcommand_parser(coordinator_cli.build_parser(), "run")
    swarm = swarm_cli.build_parser()
    shared = {"run", "model", "stages", "skip", "strategy", "data", "tokenizer", "seed", "steps",
              "microbatch_samples", "seq_len", "microbatches", "lr", "checkpoint_dir", "status_port", "join_key"}
    by_dest = {p: {a.dest: a for a in parser._actions} for p, parser in (("run", run), ("swarm", swarm))}
    for dest in shared:
        a, b = by_dest["run"][dest], by_dest["swarm"][dest]
        assert a.option_strings == b.option_strings and a.metavar == b.metavar and a.choices == b.choices, dest
        if dest not in LAUNCHER_DEFAULTS:
            assert a.default == b.default and a.type is b.type and a.help == b.help, dest
    assert {d: by_dest["swarm"][d].default for d in LAUNCHER_DEFAULTS} == LAUNCHER_DEFAULTS
