"""Choosing and checking the compute device, and reserving its memory up front.

check_device() runs at start-up (the CLI maps DeviceError to exit 2): a CPU-only torch, no
visible GPU, an index out of range, a busy GPU (exclusive mode or too little free memory) and a
--max-vram above the GPU's size each get one clear line. The GPU is inspected in a short child
process so that CUDA is not initialised in the peer before its DHT forks.

Once the run's model is known, reserve() checks that the largest stage's parameters, gradients,
AdamW moments and `max_activations` stashed microbatches fit under the cap, then allocates that
much and frees it: torch's caching allocator keeps the memory, so neither another process nor
fragmentation can take it away hours later; set_per_process_memory_fraction enforces the cap.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import torch

from peer.compute.model import ModelConfig, count_parameters

GIB = 1024 ** 3
MIN_FREE_BYTES = 512 * 1024 ** 2      # less than this free on the GPU: someone else is using it
BYTES_PER_PARAM = 16                  # fp32 weight + fp32 grad + two fp32 AdamW moments
ACTIVATION_MARGIN = 1.25              # allocator rounding, autograd temporaries


class DeviceError(Exception):
    """A device the peer cannot use; the message says what to do (exit 2)."""


def parse_device(gpu: int | None, device: str) -> torch.device:
    if gpu is not None:
        if gpu < 0:
            raise DeviceError(f"--gpu {gpu}: a GPU index is >= 0")
        return torch.device("cuda", gpu)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise DeviceError(f"--device {device!r}: expected cpu, cuda, cuda:N or mps") from None
    if dev.type == "mps":   # Apple silicon: torch's Metal backend, where this torch build has it
        if not mps_available():
            raise DeviceError(f"--device {device!r}: torch reports no MPS device here (it needs macOS on Apple "
                              "silicon and a torch build with MPS); use --device cpu")
        return torch.device("mps")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"--device {device!r}: only cpu, cuda[:N] and mps are supported")
    return torch.device("cuda", dev.index or 0) if dev.type == "cuda" else dev


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def parse_vram(text: str) -> int:
    """'12', '12G', '12GiB', '800M', '800MB' -> bytes (a bare number is GiB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GgMm]?)(?:i?[Bb])?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a size like 12, 12GB or 800MB, got {text!r}")
    scale = 1024 ** 2 if m.group(2).lower() == "m" else GIB
    return int(float(m.group(1)) * scale)


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def probe_gpu(index: int) -> dict:
    """In this process: {'name', 'total', 'free'} of GPU `index`, or DeviceError."""
    if torch.version.cuda is None or not hasattr(torch, "cuda"):
        raise DeviceError(f"this torch ({torch.__version__}) is a CPU-only build: install a CUDA build "
                          f"of torch (see pytorch.org) or run with --device cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceError("no CUDA GPU is visible (driver not loaded? CUDA_VISIBLE_DEVICES empty?): "
                          "check nvidia-smi, or run with --device cpu")
    if not 0 <= index < count:
        raise DeviceError(f"--gpu {index}: this machine has {count} CUDA device(s), "
                          f"valid indices are 0..{count - 1}")
    try:
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_name(index)
    except RuntimeError as exc:
        if "busy" in str(exc) or "unavailable" in str(exc):
            raise DeviceError(f"GPU {index} is busy (exclusive compute mode, in use by another process): "
                              f"pick another with --gpu N") from None
        raise DeviceError(f"GPU {index} cannot be used: {str(exc).splitlines()[0]}") from None
    if free < MIN_FREE_BYTES:
        raise DeviceError(f"GPU {index} ({name}) is busy: only {gib(free)} of {gib(total)} free; "
                          f"stop what is using it or pick another with --gpu N")
    return {"name": name, "total": int(total), "free": int(free)}


def _probe_isolated(index: int, timeout_s: float = 120.0) -> dict:
    cmd = [sys.executable, "-m", "peer.compute.device", str(index)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"GPU {index} did not answer within {timeout_s:.0f}s (hung driver?)") from None
    try:
        reply = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeviceError(f"probing GPU {index} failed: {(out.stderr.strip() or 'no output')[-300:]}") from None
    if "error" in reply:
        raise DeviceError(reply["error"])
    return reply


def check_device(dev: str | torch.device, max_vram: int = 0, isolated: bool = True) -> dict | None:
    """Validate `dev` (and --max-vram against it); the GPU's facts, None for the CPU."""
    dev = torch.device(dev)
    if dev.type in ("cpu", "mps"):   # mps: unified memory, nothing to reserve or probe apart
        if max_vram:
            raise DeviceError("--max-vram caps GPU memory: use it with --gpu N")
        return None
    index = dev.index or 0
    if torch.version.cuda is None:      # fail fast without a child process
        probe_gpu(index)
    info = _probe_isolated(index) if isolated else probe_gpu(index)
    if max_vram > info["total"]:
        raise DeviceError(f"--max-vram {gib(max_vram)} is more than GPU {index} has ({gib(info['total'])})")
    return info


def activation_bytes(config: ModelConfig, layers: int, samples: int, seq_len: int,
                     elem_bytes: int) -> int:
    """Estimated autograd memory one stashed microbatch holds on a stage of `layers` layers:
    per token and layer ~10 hidden-size tensors (norms, q/k/v, rotary, attention out, residuals)
    and ~5 FFN-size ones (gate, up, SiLU, product, down input). bench/gpu.py measures the truth."""
    per_token = 10 * config.dim + 5 * config.ffn_hidden
    return int(layers * samples * seq_len * per_token * elem_bytes * ACTIVATION_MARGIN)


def stage_budget(config: ModelConfig, layers: int, origin: bool, samples: int, seq_len: int,
                 max_activations: int, autocast: bool) -> int:
    params = count_parameters(config, layers, with_embed_head=origin)
    acts = activation_bytes(config, layers, samples, seq_len, 2 if autocast else 4)
    logits = 3 * samples * seq_len * config.vocab_size * 4 if origin else 0  # head_loss, transient
    return params * BYTES_PER_PARAM + max_activations * acts + logits


def reserve(dev: torch.device, budget: int, max_vram: int = 0) -> int:
    """Cap this process at max_vram and hold `budget` bytes in the caching allocator; returns the
    bytes reserved (0 on CPU). DeviceError if it does not fit."""
    if dev.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(dev)
    cap = max_vram or total
    if budget > min(cap, free):
        raise DeviceError(f"this stage needs ~{gib(budget)} on {dev} (weights, AdamW state, activations) "
                          f"but {'--max-vram allows' if max_vram and cap < free else 'only'} "
                          f"{gib(min(cap, free))}{'' if max_vram else ' is free'}: lower --max-activations "
                          f"or use a larger GPU")
    if max_vram:
        torch.cuda.set_per_process_memory_fraction(min(1.0, max_vram / total), dev)
    try:
        block = torch.empty(budget, dtype=torch.uint8, device=dev)
    except torch.cuda.OutOfMemoryError:
        raise DeviceError(f"could not reserve {gib(budget)} on {dev}: another process took the memory") from None
    del block                              # back to torch's cache, not to the driver
    return budget


def _main(argv: list[str]) -> int:
    """`python -m peer.compute.device N`: probe GPU N in a fresh process, one JSON line."""
    try:
        print(json.dumps(probe_gpu(int(argv[0]))))
    except DeviceError as exc:
        print(json.dumps({"error": str(exc)}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
