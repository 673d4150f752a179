"""peer/benchmark_cli.py: the fresh benchmark a local swarm takes before its peers start."""
import json
import subprocess
import sys

from coordinator.local_swarm import benchmark_once
from peer.benchmark_cli import main
from peer.hardware import benchmark_layer


def test_a_stale_cached_benchmark_is_replaced(tmp_path, capsys):
    kw = dict(samples=2, seq_len=16, cache_dir=tmp_path)
    benchmark_layer("tiny", "cpu", reps=1, warmup=0, **kw)
    path = tmp_path / "layer_benchmarks.json"
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    data["entries"][key]["fwd_s_per_layer_sample"] = 5.0       # a reading from a box under load
    path.write_text(json.dumps(data))
    assert benchmark_layer("tiny", "cpu", **kw).fwd_s_per_layer_sample == 5.0
    assert main(["--model", "tiny", "--samples", "2", "--seq-len", "16", "--cache-dir", str(tmp_path)]) == 0
    again = benchmark_layer("tiny", "cpu", **kw)
    assert again.cached and 0 < again.fwd_s_per_layer_sample < 1.0
    assert "forward" in capsys.readouterr().out


def test_bad_flags_and_models_exit_2_with_one_line(tmp_path):
    for args in (["--samples", "0"], ["--model", "no-such-model", "--cache-dir", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "peer.benchmark_cli", *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1 and "error" in done.stderr


def test_the_launcher_reports_a_failed_benchmark_instead_of_failing():
    line = benchmark_once("no-such-model", 2, 16)
    assert "unknown model config" in line
