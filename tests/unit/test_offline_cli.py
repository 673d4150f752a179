import argparse
import json
import subprocess
import sys

import pytest

from coordinator.offline_cli import register
from protocol.schedule import schedule_from_json
from protocol.topology import load_topology


def run(argv):
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    args = p.parse_args(argv)
    return args.func(args)


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
                "--seed", "2", "-o", str(out), "--run", "demo"]) == 0
    s = schedule_from_json(out.read_text())
    assert s.run == "demo" and s.order is not None and s.predicted_iteration_s > 0
    capsys.readouterr()
    assert run(["simulate", str(out), "--topology", str(topo_file), "--json", "--gantt", str(svg)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "skippipe" and report["violations"] == []
    assert report["iteration_time_s"] == pytest.approx(s.predicted_iteration_s, rel=1e-6)
    assert set(report["busy_fraction"]) == {n.id for n in load_topology(topo_file).nodes}
    assert svg.stat().st_size > 1000
    assert run(["simulate", str(out), "--topology", str(topo_file), "--gantt", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", ["full", "random-skip"])
def test_baselines_via_cli(topo_file, tmp_path, strategy):
    out = tmp_path / "s.json"
    assert run(["plan", "--topology", str(topo_file), "--strategy", strategy, "-o", str(out)]) == 0
    assert schedule_from_json(out.read_text()).strategy == strategy


def test_errors_exit_2_with_one_line(topo_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [
        ["plan", "--topology", str(bad), "-o", str(tmp_path / "x.json")],
        ["plan", "--topology", str(tmp_path / "missing.json")],
        ["plan", "--topology", str(topo_file), "--skip", "1.0"],
        ["simulate", str(bad), "--topology", str(topo_file)],
    ]
    for argv in cases:
        capsys.readouterr()
        assert run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("skippipe-coordinator: error: ")
    small = tmp_path / "small.json"
    assert run(["topology", "--preset", "single", "--nodes", "3", "-o", str(small)]) == 0
    assert run(["plan", "--topology", str(small)]) == 2
    assert "3 nodes but 6 stages" in capsys.readouterr().err


def test_module_main(topo_file, tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "coordinator.offline_cli", "plan", "--topology", str(topo_file),
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and out.exists()
    assert "predicted iteration" in r.stdout
