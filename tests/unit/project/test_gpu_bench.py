"""bench/gpu.py runs end to end: on the CPU with --dry-run (bf16 autocast forced on, tiny
model), and on a real GPU with a tiny model (marked `gpu`)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[3] / "bench" / "gpu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(capsys, tmp_path, *argv):
    bench = load_bench()
    try:
        assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(1)   # the bench sets threads for itself; keep the suite's setting
    lines = capsys.readouterr().out.strip().splitlines()
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    return lines, fields, json.loads((tmp_path / "gpu.json").read_text())


def test_dry_run_ends_with_result_and_writes_figures(capsys, tmp_path):
    lines, fields, report = run(capsys, tmp_path, "--dry-run", "--stages", "2", "--peers", "2")
    assert lines[-1].startswith("RESULT ")
    assert "bfloat16 autocast" in lines[0]                    # the GPU code path, on the CPU
    assert float(fields["tokens_per_s_tiny"]) > 0 and float(fields["swarm_vs_single"]) > 0
    assert [r["stage"] for r in report["stages"]] == [0, 1]
    assert report["swarm_tokens_per_s"] > 0 and report["single_tokens_per_s"] > 0


def test_bad_arguments_exit_2(capsys):
    bench = load_bench()
    assert bench.main(["--device", "cpu", "--models", "nope"]) == 2
    assert bench.main(["--device", "cpu", "--peers", "1"]) == 2
    if torch.version.cuda is None:
        assert bench.main(["--device", "cuda:0"]) == 2
        assert "CPU-only build" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bench_tiny(capsys, tmp_path):
    lines, fields, report = run(capsys, tmp_path, "--device", "cuda:0", "--models", "tiny", "--swarm-model",
                                "tiny", "--seq-len", "64", "--swarm-seq", "64", "--iterations", "2",
                                "--microbatches", "2", "--rounds", "1", "--stages", "2")
    assert fields["device"] == "cuda" and float(fields["peak_mem_gb_stage"]) > 0
    assert all(r["peak_mem_gb"] > 0 for r in report["stages"])
