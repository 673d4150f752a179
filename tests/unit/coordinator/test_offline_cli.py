import re
import json
import subprocess
import sys

import pytest

from coordinator import cli as coordinator_cli
from protocol.schedule import schedule_from_json
from protocol.topology import load_topology


QUICK = ["--partitions", "2"]   # these tests check the command, not the search (its own tests do)


def run(argv):
    """The real `skippipe-coordinator` entry point; its exit code (argparse's too)."""
    try:
        return coordinator_cli.main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.fixture
def topo_file(tmp_path):
    path = tmp_path / "t.json"
    assert run(["topology", "--preset", "geo", "--nodes", "12", "--seed", "3", "-o", str(path)]) == 0
    return path


def test_topology_presets(tmp_path):
    for preset in ("geo", "clusters", "single"):
        path = tmp_path / f"{preset}.json"
        assert run(["topology", "--preset", preset, "--nodes", "9", "--seed", "1", "--stages", "3",
                    "--layers", "12", "-o", str(path)]) == 0
        t = load_topology(path)
        assert len(t.nodes) == 9 and t.workload.num_stages == 3
        lat = [v for row in t.links.latency_ms for v in row if v > 0]
        assert 0.4 <= min(lat) and max(lat) <= 300


def test_plan_simulate_round_trip_and_gantt(topo_file, tmp_path, capsys):
    out, svg, png = tmp_path / "s.json", tmp_path / "g.svg", tmp_path / "g.png"
    assert run(["plan", "--topology", str(topo_file), "--skip", "1/3", "--strategy", "skippipe",
                "--seed", "2", "-o", str(out), "--run", "demo", *QUICK]) == 0
    s = schedule_from_json(out.read_text())
    assert s.run == "demo" and s.order is not None and s.predicted_iteration_s > 0
    assert re.search(r"steady period [\d.]+ s, lower bound [\d.]+ s, gap [\d.]+", capsys.readouterr().out)
    assert run(["simulate", str(out), "--topology", str(topo_file), "--json", "--gantt", str(svg)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "skippipe" and report["violations"] == []
    assert report["iteration_time_s"] == pytest.approx(s.predicted_iteration_s, rel=1e-6)
    assert report["span_s"] == report["iteration_time_s"] and report["period_s"] <= report["span_s"]
    assert 0 < report["lower_bound_s"] <= report["period_s"]
    assert report["bound_gap"] == pytest.approx(report["period_s"] / report["lower_bound_s"], rel=1e-3)
    assert set(report["busy_fraction"]) == {n.id for n in load_topology(topo_file).nodes}
    assert svg.stat().st_size > 1000
    assert run(["simulate", str(out), "--topology", str(topo_file), "--gantt", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_gantt_title_gives_stdouts_steady_state_time_and_has_a_legend(topo_file, tmp_path, capsys):
    import matplotlib
    out, svg = tmp_path / "s.json", tmp_path / "g.svg"
    assert run(["plan", "--topology", str(topo_file), "-o", str(out), *QUICK]) == 0
    capsys.readouterr()
    with matplotlib.rc_context({"svg.fonttype": "none"}):   # text as <text>, to be read back
        assert run(["simulate", str(out), "--topology", str(topo_file), "--gantt", str(svg)]) == 0
    said = re.search(r"iteration (\d+\.\d\d) s", capsys.readouterr().out).group(1)
    drawn = svg.read_text()
    assert f"iteration {said} s (steady state)" in drawn
    assert all(label in drawn for label in ("forward (colour = microbatch)", "backward", "head + loss"))


def test_gantt_without_matplotlib_is_one_clear_line(topo_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.json"
    assert run(["plan", "--topology", str(topo_file), "-o", str(out), *QUICK]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    assert run(["simulate", str(out), "--topology", str(topo_file), "--gantt", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["skippipe-coordinator: error: --gantt needs matplotlib: pip install 'skippipe-swarm[plot]' "
                   "(or pip install matplotlib)"]
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.parametrize("skip,length", [("1/3", 4), ("0.3333", 4), ("0.33", 4), ("0.3", 5), ("0", 6)])
def test_plan_prints_the_path_length_it_uses(tmp_path, capsys, skip, length):
    topo = tmp_path / "t.json"
    assert run(["topology", "--preset", "single", "--nodes", "6", "--stages", "6", "-o", str(topo)]) == 0
    out = tmp_path / "s.json"
    assert run(["plan", "--topology", str(topo), "--skip", skip, "-o", str(out), *QUICK]) == 0
    assert f"each microbatch visits {length} of 6 stages (path length {length})" in capsys.readouterr().out
    assert {len(r.hops) for r in schedule_from_json(out.read_text()).routes} == {length}
    assert run(["simulate", str(out), "--topology", str(topo)]) == 0
    assert f"path length {length} of 6 stages" in capsys.readouterr().out


@pytest.mark.parametrize("strategy", ["full", "random-skip"])
def test_baselines_via_cli(topo_file, tmp_path, strategy):
    out = tmp_path / "s.json"
    assert run(["plan", "--topology", str(topo_file), "--strategy", strategy, "-o", str(out), *QUICK]) == 0
    assert schedule_from_json(out.read_text()).strategy == strategy


def test_plan_searches_the_partitions_asked_for(topo_file, tmp_path, monkeypatch):
    import coordinator.offline_cli as offline_cli
    from coordinator.planner import PlanningError
    asked = []

    def record(topology, config, seed):     # what the command asks the planner for, not a plan
        asked.append(config.planner.partitions)
        raise PlanningError("recorded")
    monkeypatch.setattr(offline_cli, "plan", record)
    assert run(["plan", "--topology", str(topo_file), "--partitions", "5"]) == 2
    assert run(["plan", "--topology", str(topo_file), "--strategy", "full"]) == 2
    assert asked == [5, 0]          # 0: the planner's own choice (auto)


def test_errors_exit_2_with_one_line(topo_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [
        ["plan", "--topology", str(bad), "-o", str(tmp_path / "x.json")],
        ["plan", "--topology", str(tmp_path / "missing.json")],
        ["plan", "--topology", str(topo_file), "--skip", "1.0"],
        ["plan", "--topology", str(topo_file), "--partitions", "-1"],
        ["simulate", str(bad), "--topology", str(topo_file)],
    ]
    for argv in cases:
        capsys.readouterr()
        assert run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.match(r"skippipe-coordinator( plan)?: error: ", err[0]), err
    # a topology `plan` cannot use is refused where it is made ...
    small = tmp_path / "small.json"
    assert run(["topology", "--preset", "single", "--nodes", "2", "--stages", "6", "-o", str(small)]) == 2
    assert "--nodes 2 is fewer than --stages 6" in capsys.readouterr().err and not small.exists()
    # ... and one from elsewhere where it is planned
    import random
    from coordinator.planner.presets import make_topology
    from protocol.topology import topology_to_json
    small.write_text(topology_to_json(make_topology("single", 3, random.Random(0), stages=6)))
    assert run(["plan", "--topology", str(small)]) == 2
    assert "3 nodes but 6 stages" in capsys.readouterr().err


def test_module_main(topo_file, tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "coordinator.offline_cli", "plan", "--topology", str(topo_file),
                        "-o", str(out), *QUICK], capture_output=True, text=True)
    assert r.returncode == 0 and out.exists()
    assert "predicted iteration" in r.stdout
