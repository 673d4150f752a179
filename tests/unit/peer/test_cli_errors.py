"""Issue 23's argument errors: every one is ONE line on stderr and exit code 2, raised by the
parser before any network or compute starts; --version on all three scripts from one source."""
import re
import sys
import tomllib
from pathlib import Path

import pytest

from coordinator import cli as coordinator_cli
from launcher import cli as swarm_cli
from peer import cli as peer_cli
from swarmcore.cli.support import skip_ratio
from protocol.version import PACKAGE_VERSION, package_version

ROOT = Path(__file__).resolve().parents[3]
PEER_ID = "12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"
MADDR = f"/ip4/127.0.0.1/tcp/4000/p2p/{PEER_ID}"
SCRIPTS = {"skippipe-coordinator": coordinator_cli.main, "skippipe-peer": peer_cli.main,
           "skippipe-swarm": swarm_cli.main}
NEEDS = {"skippipe-peer": ["--initial-peers", MADDR]}   # what a script requires besides the bad flag


def exit_code_and_err(main, argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


def one_line_usage_error(main, argv, capsys, *, contains: str) -> str:
    code, err = exit_code_and_err(main, argv, capsys)
    assert code == 2 and len(err) == 1, (code, err)
    assert contains in err[0], err[0]
    return err[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_version_from_one_source(script, capsys):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert package_version() == pyproject == PACKAGE_VERSION
    with pytest.raises(SystemExit) as done:
        SCRIPTS[script](["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"{script} {pyproject}"


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("where", ["flag", "config", "env"])
def test_bad_run_name_is_one_line(script, where, tmp_path, capsys, monkeypatch):
    argv = list(NEEDS.get(script, []))
    if where == "flag":
        argv += ["--run", "bad name!"]
    elif where == "config":
        cfg = tmp_path / "c.toml"
        cfg.write_text('run = "bad name!"\n')
        argv += ["--config", str(cfg)]
    else:
        monkeypatch.setenv("SKIPPIPE_RUN", "bad name!")
    one_line_usage_error(SCRIPTS[script], argv, capsys, contains="invalid run name 'bad name!'")


@pytest.mark.parametrize("script", ["skippipe-coordinator", "skippipe-swarm"])
def test_unknown_model_is_refused_at_once(script, capsys):
    line = one_line_usage_error(SCRIPTS[script], ["--model", "huge"], capsys, contains="unknown model config 'huge'")
    assert "tiny, small, 500m, 1.5b" in line


@pytest.mark.parametrize("script", ["skippipe-coordinator", "skippipe-peer"])   # the swarm takes no addresses
@pytest.mark.parametrize("flag", ["--initial-peers", "--host-maddrs", "--announce-maddrs"])
def test_multiaddrs_are_checked(script, flag, capsys):
    argv = [*NEEDS.get(script, []), flag, "/ip4/127.0.0.1/tcp/4000/p2p/QmPeer"]
    line = one_line_usage_error(SCRIPTS[script], argv, capsys, contains=f"argument {flag}: not a multiaddr")
    assert "QmPeer" in line


def test_unknown_subcommand_suggests_the_close_one(capsys):
    line = one_line_usage_error(coordinator_cli.main, ["plann", "--topology", "t.json"], capsys,
                                contains="unknown command 'plann' (did you mean plan?)")
    assert line.startswith("skippipe-coordinator: error: ")
    one_line_usage_error(coordinator_cli.main, ["frobnicate"], capsys, contains="unknown command 'frobnicate'")


def test_config_before_a_subcommand_applies_to_it(tmp_path, capsys):
    topo, out, cfg = tmp_path / "t.json", tmp_path / "s.json", tmp_path / "c.toml"
    assert coordinator_cli.main(["topology", "--preset", "single", "--nodes", "6", "-o", str(topo)]) == 0
    # top-level keys apply to every program; `run` here lands in the schedule
    cfg.write_text(f'run = "from-config"\n[plan]\ntopology = "{topo}"\n')
    assert coordinator_cli.main(["--config", str(cfg), "plan", "-o", str(out)]) == 0
    assert '"run": "from-config"' in out.read_text().replace(" ", "").replace('":"', '": "')
    assert coordinator_cli.with_subcommand(["--config", "c.toml", "--run", "x"]) == ["run", "--config", "c.toml",
                                                                                    "--run", "x"]


def test_eval_flag_errors_are_evals_own_one_line(tmp_path, capsys):
    one_line_usage_error(coordinator_cli.main, ["eval", "--checkpoint", str(tmp_path), "--omit", "abc"], capsys,
                         contains="skippipe-coordinator eval: error: argument --omit: expected a number in [0, 1]")


def test_junk_checkpoint_is_a_clear_line(tmp_path, capsys):
    from peer.evaluate import main as evaluate   # what `skippipe-coordinator eval` runs
    (tmp_path / "r-stage0.pt").write_bytes(bytes(range(256)) * 20)
    code, err = exit_code_and_err(evaluate, ["--checkpoint", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1, err
    assert re.fullmatch(r"skippipe-coordinator eval: error: .*r-stage0\.pt is not a stage checkpoint "
                        r"\(torch cannot read it; .*\)", err[0])


def test_topology_plan_cannot_use_is_refused(tmp_path, capsys):
    one_line_usage_error(coordinator_cli.main, ["topology", "--nodes", "2", "--stages", "6",
                                                "-o", str(tmp_path / "t.json")],
                         capsys, contains="--nodes 2 is fewer than --stages 6")
    assert not (tmp_path / "t.json").exists()


def test_one_default_skip_ratio_everywhere():
    run = coordinator_cli.subcommand_parser(coordinator_cli.build_parser(), "run").parse_args([])
    swarm = swarm_cli.build_parser().parse_args([])
    plan = coordinator_cli.subcommand_parser(coordinator_cli.build_parser(), "plan").parse_args(["--topology", "t"])
    assert run.skip == swarm.skip == plan.skip == skip_ratio("1/3")


def test_swarm_argument_errors_come_before_any_process(capsys):
    one_line_usage_error(swarm_cli.main, ["--stages", "4", "--peers", "2"], capsys,
                         contains="--stages 4 needs at least as many --peers")


def test_every_registered_subcommand_is_in_SUBCOMMANDS():
    """Adding a subcommand: its name in coordinator/cli.py's SUBCOMMANDS and its register(sub)
    call in build_parser; this catches one without the other."""
    parser = coordinator_cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert tuple(sub.choices) == coordinator_cli.SUBCOMMANDS
    for name in coordinator_cli.SUBCOMMANDS:   # and every one takes --config, before or after its name
        assert coordinator_cli.with_subcommand(["--config", "c.toml", name])[:3] == [name, "--config", "c.toml"]


@pytest.mark.parametrize("script", ["skippipe-coordinator", "skippipe-swarm"])
@pytest.mark.parametrize("value", ["-0.01", "0", "5", "nan", "fast"])
def test_a_learning_rate_outside_0_1_is_one_line(script, value, capsys):
    # a negative rate trains away from the data: refused where it is typed, as the run spec
    # refuses it when read from the DHT (protocol/messages.py)
    one_line_usage_error(SCRIPTS[script], [*NEEDS.get(script, []), "--lr", value], capsys, contains="--lr")


def test_negative_warm_up_and_steps_are_one_line(capsys):
    for flag in ("--warmup", "--steps"):
        one_line_usage_error(coordinator_cli.main, [flag, "-1"], capsys, contains=flag)
