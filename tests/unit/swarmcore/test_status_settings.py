"""swarmcore.cli.settings (flags from environment variables and a TOML file) and swarmcore.cli.logsetup."""
import io
import json
import logging

import pytest

from coordinator import cli as coordinator_cli
from launcher import cli as swarm_cli
from peer import cli as peer_cli
from swarmcore.cli.logsetup import setup_logging
from swarmcore.cli.settings import apply_settings

MADDR = "/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"
MADDR2 = MADDR.replace("127.0.0.1", "127.0.0.2")


def peer_args(argv, env, tmp_path=None):
    parser = peer_cli.build_parser()
    apply_settings(parser, argv, "peer", env)
    return parser.parse_args(argv)


def test_environment_fills_flags_and_required_ones():
    args = peer_args([], {"SKIPPIPE_INITIAL_PEERS": f"{MADDR} {MADDR2}", "SKIPPIPE_STAGE": "2",
                          "SKIPPIPE_NO_BENCHMARK": "true", "SKIPPIPE_METRICS_PORT": "off"})
    assert args.initial_peers == [MADDR, MADDR2] and args.stage == 2
    assert args.no_benchmark is True and args.metrics_port is None


def test_precedence_flag_over_section_env_over_env_over_file(tmp_path):
    cfg = tmp_path / "swarm.toml"
    cfg.write_text(f'initial-peers = ["{MADDR}"]\nrun = "from-file"\nlog_level = "DEBUG"\n'
                   f'max-activations = 3\n[peer]\nrun = "peer-section"\n[coordinator]\nrun = "coord"\n')
    env = {"SKIPPIPE_CONFIG": str(cfg), "SKIPPIPE_MAX_ACTIVATIONS": "5", "SKIPPIPE_PEER_MAX_ACTIVATIONS": "6"}
    args = peer_args([], env)
    assert args.run == ("peer-section", "") and args.log_level == "DEBUG" and args.max_activations == 6
    assert args.initial_peers == [MADDR]
    assert peer_args(["--max-activations", "7", "--run", "cli"], env).max_activations == 7
    # one file for all three: the coordinator has no --max-activations and skips that top-level key
    parser = coordinator_cli.subcommand_parser(coordinator_cli.build_parser(), "run")
    apply_settings(parser, ["--config", str(cfg)], "coordinator", {})
    assert parser.parse_args([]).run == "coord"


@pytest.mark.parametrize("env,message", [
    ({"SKIPPIPE_STAGE": "minus"}, "SKIPPIPE_STAGE: expected 'auto' or a stage number"),
    ({"SKIPPIPE_LOG_LEVEL": "LOUD"}, "SKIPPIPE_LOG_LEVEL: 'LOUD' is not one of DEBUG"),
    ({"SKIPPIPE_NO_BENCHMARK": "maybe"}, "expected true or false"),
    ({"SKIPPIPE_CONFIG": "/nonexistent/x.toml"}, "cannot read config file /nonexistent/x.toml"),
])
def test_bad_settings_are_one_line_usage_errors(env, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        peer_args(["--initial-peers", MADDR], env)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_or_malformed_config_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[peer]\nstagee = 1\n')
    with pytest.raises(SystemExit):
        peer_args(["--config", str(bad)], {})
    assert "unknown setting 'stagee' for skippipe-peer" in capsys.readouterr().err
    bad.write_text('stage = \n')
    with pytest.raises(SystemExit):
        peer_args(["--config", str(bad)], {})
    assert "is not valid TOML" in capsys.readouterr().err


def test_all_three_clis_accept_their_sections(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[coordinator]\nstatus-port = 0\nstages = 2\nlog-format = "json"\n'
                   '[swarm]\npeers = 2\nstatus_port = "off"\n')
    parser = coordinator_cli.subcommand_parser(coordinator_cli.build_parser(), "run")
    apply_settings(parser, [], "coordinator", {"SKIPPIPE_CONFIG": str(cfg)})
    args = parser.parse_args([])
    assert (args.status_port, args.stages, args.log_format) == (0, 2, "json")
    parser = swarm_cli.build_parser()
    apply_settings(parser, [], "swarm", {"SKIPPIPE_CONFIG": str(cfg)})
    args = parser.parse_args([])
    assert args.peers == 2 and args.status_port is None


def test_json_logs_are_one_object_per_line():
    stream = io.StringIO()
    handler = setup_logging("INFO", "json", stream)
    try:
        log = logging.getLogger("skippipe.test")
        log.debug("hidden")
        log.warning("peer %s unreachable: open TCP port %d", "QmX", 31337)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2           # the traceback stays inside its line
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert first["level"] == "WARNING" and first["logger"] == "skippipe.test"
    assert first["msg"] == "peer QmX unreachable: open TCP port 31337" and first["ts"].endswith("Z")
    assert "ValueError: boom" in second["exc"]


def test_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="log format"):
        setup_logging("INFO", "xml")
