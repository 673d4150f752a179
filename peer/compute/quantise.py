"""Blockwise absmax quantisation of activations and gradients (the layout: protocol/quantised.py).

`quantise` runs on the tensor's own device (a GPU sends a quarter or an eighth of the bytes over
PCIe too) and returns the payload and what the receiver will decode from it, which error
feedback needs; `dequantise` checks the payload (protocol.quantised.split) before reading it.

Rounding is to the nearest level, or stochastic (`generator` given): x / s rounds up with
probability equal to its fractional part, so the decoded value is an unbiased estimate of x
(E[decoded] = x). The sender chooses (wire.py: gradients going back); the receiver cannot tell
and need not: the layout is the same.
"""
from __future__ import annotations

import torch

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from protocol.errors import TensorError
from protocol.quantised import DEFAULT_BLOCK, QMAX, Quantised, split
from protocol.tensors import TensorPayload


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    pad = -flat.numel() % block
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.view(-1, block)


def quantise(tensor: torch.Tensor, codec: str, block: int = DEFAULT_BLOCK,
             generator: torch.Generator | None = None) -> tuple[Quantised, TensorPayload, torch.Tensor] | None:
    """(header, payload, the float32 tensor the receiver will decode) of a float tensor; None
    if it holds a NaN or Inf (it then travels as floats, and the receiver refuses it as before).
    `generator` (on the tensor's device): stochastic rounding drawn from it; None: to nearest."""
    header = Quantised(codec, block, tuple(int(d) for d in tensor.shape))
    flat = tensor.detach().reshape(-1).to(torch.float32)
    n, qmax = flat.numel(), QMAX[codec]
    blocks = _blocks(flat, block)
    scales = blocks.abs().amax(dim=1) / qmax
    if not bool(torch.isfinite(scales).all()):
        return None
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    scaled = blocks / safe[:, None]
    if generator is None:
        scaled = torch.round(scaled)
    else:
        noise = torch.rand(scaled.shape, generator=generator, device=scaled.device, dtype=scaled.dtype)
        scaled = torch.floor(scaled.add_(noise))
    q = scaled.clamp_(-qmax, qmax).to(torch.int8)
    restored = (q.to(torch.float32) * scales[:, None]).view(-1)[:n].view(tensor.shape)
    values = q.view(-1)[:n]
    if codec == "int4":
        nibbles = (values + 8).to(torch.uint8)
        if n % 2:
            nibbles = torch.cat([nibbles, nibbles.new_full((1,), 8)])
        values = nibbles[0::2] | (nibbles[1::2] << 4)
    packed = torch.cat([scales.contiguous().view(torch.uint8), values.contiguous().view(torch.uint8)])
    payload = tensor_codec.encode(packed)
    return header, payload, restored


def dequantise(header: Quantised, payload: TensorPayload, what: str = "tensor") -> torch.Tensor:
    """The float32 tensor a quantised payload holds. Raises BadTensor (code BAD_TENSOR) when
    the payload does not match its header or a scale is negative, NaN or infinite."""
    try:
        raw_scales, raw_values = split(header, payload)
    except TensorError as exc:
        raise BadTensor(what, str(exc)) from None
    n = header.numel
    scales = torch.frombuffer(bytearray(raw_scales), dtype=torch.float32) if len(raw_scales) else \
        torch.zeros(0, dtype=torch.float32)
    raw = torch.frombuffer(bytearray(raw_values), dtype=torch.uint8) if len(raw_values) else \
        torch.zeros(0, dtype=torch.uint8)
    if header.codec == "int8":
        q = raw.view(torch.int8)
    else:
        q = torch.stack([raw & 0x0F, raw >> 4], dim=1).view(-1)[:n].to(torch.int8) - 8
    values = _blocks(q.to(torch.float32), header.block) * scales[:, None]
    return values.view(-1)[:n].view(header.shape)
