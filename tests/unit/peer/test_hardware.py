"""peer.hardware: device probe and cached one-layer benchmark."""
import json

import pytest

from peer.hardware import benchmark_layer, probe_device


def test_probe_cpu():
    info = probe_device("cpu")
    assert info.device == "cpu" and info.name
    assert info.total_memory_bytes >= info.free_memory_bytes >= 0


def test_benchmark_positive_and_cached(tmp_path):
    kw = dict(device="cpu", samples=1, seq_len=16, reps=1, warmup=0, cache_dir=tmp_path)
    first = benchmark_layer("tiny", **kw)
    assert first.fwd_s_per_layer_sample > 0 and first.bwd_s_per_layer_sample >= 0
    assert not first.cached and first.device == "cpu" and first.config == "tiny"
    second = benchmark_layer("tiny", **kw)
    assert second.cached and second.fwd_s_per_layer_sample == first.fwd_s_per_layer_sample
    fresh = benchmark_layer("tiny", use_cache=False, **kw)
    assert not fresh.cached
    data = json.loads((tmp_path / "layer_benchmarks.json").read_text())
    assert len(data["entries"]) == 1 and "tiny|cpu|" in next(iter(data["entries"]))


def test_corrupt_cache_is_ignored(tmp_path):
    (tmp_path / "layer_benchmarks.json").write_text("{not json")
    r = benchmark_layer("tiny", "cpu", samples=1, seq_len=8, reps=1, warmup=0, cache_dir=tmp_path)
    assert not r.cached and r.fwd_s_per_layer_sample > 0


def test_benchmark_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        benchmark_layer("tiny", "cpu", seq_len=10_000, cache_dir=tmp_path)
    with pytest.raises(KeyError):
        benchmark_layer("huge", "cpu", cache_dir=tmp_path)
