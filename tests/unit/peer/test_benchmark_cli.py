"""peer/benchmark_cli.py: the fresh benchmark a local swarm takes before its peers start."""
import json
import subprocess
import sys

import pytest

from launcher.processes import benchmark_once
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


def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as done:   # before torch is even imported for the measurement
        main(["--cache-dir", str(blocker / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1
    assert f"--cache-dir {blocker / 'cache'} cannot be written (Not a directory)" in err[0]
    # the measurement itself survives a cache it cannot write: a warning, not FileNotFoundError
    bench = benchmark_layer("tiny", "cpu", reps=1, warmup=0, samples=2, seq_len=16, cache_dir=blocker / "cache")
    assert bench.fwd_s_per_layer_sample > 0 and not bench.cached
    assert "cannot cache the layer benchmark" in caplog.text


def test_peer_refuses_an_unwritable_cache_or_checkpoint_folder(tmp_path, capsys):
    from peer import cli as peer_cli
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    maddr = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"
    for flag in ("--cache-dir", "--checkpoint-dir"):
        with pytest.raises(SystemExit) as done:
            peer_cli.main(["--initial-peers", maddr, flag, str(blocker / "x")])
        err = capsys.readouterr().err.strip().splitlines()
        assert done.value.code == 2 and len(err) == 1 and f"{flag} {blocker / 'x'} cannot be written" in err[0]
