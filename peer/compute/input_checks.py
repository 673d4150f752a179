"""What a stage accepts as input: hidden states and token ids of the run's model, checked before
any compute (a remote peer's tensor must never crash or poison the stage)."""
import torch

from peer.compute.errors import BadTensor
from peer.compute.host_buffers import DeviceIO


def checked_hidden(what: str, t, shape: tuple[int, ...] | None, config, dtype: torch.dtype,
                   io: DeviceIO | None, device) -> torch.Tensor:
    """`t` as a (batch, seq, dim) tensor of `dtype` on `device`; BadTensor if it is not one."""
    if not isinstance(t, torch.Tensor):
        raise BadTensor(what, f"expected a torch.Tensor, got {type(t).__name__}")
    if io is not None:
        t = io.to_compute(t)
    if t.dtype != dtype:
        raise BadTensor(what, f"dtype {t.dtype}, expected {dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise BadTensor(what, f"shape {list(t.shape)}, expected {list(shape)}")
    if t.ndim != 3 or t.shape[0] < 1 or not 1 <= t.shape[1] <= config.max_seq_len or t.shape[2] != config.dim:
        raise BadTensor(what, f"shape {list(t.shape)}, expected (batch>=1, 1..{config.max_seq_len}, {config.dim})")
    if not bool(torch.isfinite(t).all()):
        raise BadTensor(what, "contains NaN or Inf", non_finite=True)
    return t.to(device)


def checked_tokens(what: str, t, shape: tuple[int, ...] | None, config, device) -> torch.Tensor:
    """`t` as (batch, seq) int64 token ids below the vocabulary size, on `device`."""
    if not isinstance(t, torch.Tensor):
        raise BadTensor(what, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int64:
        raise BadTensor(what, f"dtype {t.dtype}, expected torch.int64")
    if t.ndim != 2 or t.shape[0] < 1 or not 1 <= t.shape[1] <= config.max_seq_len:
        raise BadTensor(what, f"shape {list(t.shape)}, expected (batch>=1, 1..{config.max_seq_len})")
    if shape is not None and tuple(t.shape) != shape:
        raise BadTensor(what, f"shape {list(t.shape)}, expected {list(shape)}")
    if int(t.min()) < 0 or int(t.max()) >= config.vocab_size:
        raise BadTensor(what, f"token ids outside 0..{config.vocab_size - 1}")
    return t.to(device)
