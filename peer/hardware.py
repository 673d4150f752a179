"""Probe the compute device and benchmark one decoder layer on it (cached as JSON).

The planner needs seconds per layer per sample for forward and backward; measuring one layer
is enough because all layers of a config are the same shape.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from peer.compute.model import ModelConfig, get_config, new_block, rotary_tables

CACHE_FORMAT = 1
logger = logging.getLogger("skippipe.peer")


@dataclass(frozen=True)
class DeviceInfo:
    device: str                       # "cpu" or "cuda:N"
    name: str
    total_memory_bytes: int
    free_memory_bytes: int


@dataclass(frozen=True)
class LayerBenchmark:
    config: str
    device: str
    torch_version: str
    samples: int
    seq_len: int
    fwd_s_per_layer_sample: float
    bwd_s_per_layer_sample: float
    cached: bool = False


def default_device() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "skippipe-swarm"


def _cpu_memory() -> tuple[int, int]:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):    # not POSIX: unknown
        return 0, 0


def probe_device(device: str | None = None) -> DeviceInfo:
    dev = torch.device(device or default_device())
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else 0
        free, total = torch.cuda.mem_get_info(index)
        return DeviceInfo(f"cuda:{index}", torch.cuda.get_device_name(index), total, free)
    total, free = _cpu_memory()
    if dev.type == "mps":   # Apple silicon: the GPU shares the machine's memory
        return DeviceInfo("mps", "Apple MPS", total, free)
    return DeviceInfo("cpu", _cpu_name(), total, free)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"cpu x{os.cpu_count()}"


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def measure_layer(config: ModelConfig, device: str, samples: int, seq_len: int,
                  reps: int, warmup: int, autocast: torch.dtype | None = None) -> tuple[float, float]:
    """Median seconds of one layer's forward and of forward+backward -> (fwd, bwd) per sample.
    autocast: the dtype the stage really computes in (bf16 on CUDA), so the figure is the device's."""
    dev = torch.device(device)
    block = new_block(config, 0, 0).to(dev)
    cos, sin = (t[:seq_len].to(dev) for t in rotary_tables(config.head_dim, seq_len,
                                                            config.rope_theta))
    x = torch.randn(samples, seq_len, config.dim, device=dev, requires_grad=True)
    fwd_times, total_times = [], []
    for i in range(warmup + reps):
        _sync(dev)
        t0 = time.perf_counter()
        with (torch.autocast(dev.type, dtype=autocast) if autocast else contextlib.nullcontext()):
            y = block(x, cos, sin)
        _sync(dev)
        t1 = time.perf_counter()
        y.backward(torch.ones_like(y))
        _sync(dev)
        t2 = time.perf_counter()
        block.zero_grad(set_to_none=True)
        x.grad = None
        if i >= warmup:
            fwd_times.append(t1 - t0)
            total_times.append(t2 - t0)
    fwd = sorted(fwd_times)[len(fwd_times) // 2]
    bwd = max(sorted(total_times)[len(total_times) // 2] - fwd, 0.0)
    return fwd / samples, bwd / samples


def benchmark_layer(config: ModelConfig | str, device: str | None = None, *, samples: int = 2,
                    seq_len: int | None = None, reps: int = 3, warmup: int = 1,
                    cache_dir: str | Path | None = None, use_cache: bool = True,
                    autocast: torch.dtype | None = None) -> LayerBenchmark:
    """Benchmark one layer forward+backward; cached under cache_dir (default ~/.cache/...).

    use_cache=False measures afresh (the --no-cache bypass) and still refreshes the cache.
    """
    cfg = get_config(config) if isinstance(config, str) else config
    dev = str(torch.device(device or default_device()))
    seq_len = seq_len or min(cfg.max_seq_len, 128)
    if not 1 <= seq_len <= cfg.max_seq_len or samples < 1 or reps < 1 or warmup < 0:
        raise ValueError("need 1 <= seq_len <= max_seq_len, samples >= 1, reps >= 1, warmup >= 0")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / "layer_benchmarks.json"
    key = f"{cfg.name}|{dev}|{torch.__version__}|{samples}x{seq_len}" + (f"|{autocast}" if autocast else "")
    entries = _read_cache(path)
    if use_cache and isinstance(entries.get(key), dict):
        try:
            return LayerBenchmark(**{**entries[key], "cached": True})
        except TypeError:                     # an older or hand-edited entry: re-measure
            pass
    fwd, bwd = measure_layer(cfg, dev, samples, seq_len, reps, warmup, autocast)
    result = LayerBenchmark(cfg.name, dev, torch.__version__, samples, seq_len, fwd, bwd)
    entries[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
    _write_cache(path, entries)
    return result


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict) -> None:
    # Write-then-rename so a concurrent reader never sees half a file.
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=1))
        tmp.replace(path)
    except OSError as exc:  # the measurement still stands; only the next start measures again
        logger.warning("cannot cache the layer benchmark in %s (%s); it is measured again next time",
                       path.parent, exc.strerror or exc)

