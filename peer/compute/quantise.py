"""Blockwise quantisation of activations and gradients (the layout: protocol/quantised.py):
absmax (symmetric levels around zero), or with `offsets` min/max (unsigned levels from each
block's minimum); with `channels` the blocks run along a channel (the last dimension) instead
of along a token (protocol/quantised.py).

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
from protocol.quantised import DEFAULT_BLOCK, LEVELS, QMAX, Quantised, split
from protocol.tensors import TensorPayload


def blocks_of(flat: torch.Tensor, block: int, repeat_last: bool = False) -> torch.Tensor:
    """`flat` as rows of `block`, the last padded with zeros (or with its last value, which
    leaves a min/max block's range as it is)."""
    pad = -flat.numel() % block
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad), value=float(flat[-1]) if repeat_last else 0.0)
    return flat.view(-1, block)


def channel_major(tensor: torch.Tensor) -> torch.Tensor:
    """The flat sequence channel blocks are cut from: (..., C) as its (C, N) transpose, row-major."""
    return tensor.reshape(-1, tensor.shape[-1]).t().reshape(-1)


def from_channel_major(flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `channel_major`: a tensor of `shape` from its channel-major sequence."""
    channels = shape[-1]
    return flat.view(channels, -1).t().reshape(shape)


def quantise(tensor: torch.Tensor, codec: str, block: int = DEFAULT_BLOCK,
             generator: torch.Generator | None = None, offsets: bool = False,
             channels: bool = False) -> tuple[Quantised, TensorPayload, torch.Tensor] | None:
    """(header, payload, the float32 tensor the receiver will decode) of a float tensor; None
    if it holds a NaN or Inf (it then travels as floats, and the receiver refuses it as before).
    `generator` (on the tensor's device): stochastic rounding drawn from it; None: to nearest.
    `offsets`: min/max blocks (only for a receiver that speaks protocol 1.11); `channels`:
    channel blocks (1.12; a tensor of two or more dimensions)."""
    header = Quantised(codec, block, tuple(int(d) for d in tensor.shape), offsets, channels)
    flat = tensor.detach().to(torch.float32)
    flat = channel_major(flat) if channels else flat.reshape(-1)
    n = flat.numel()
    blocks = blocks_of(flat, block, repeat_last=offsets)
    if offsets:                              # levels 0..LEVELS up from each block's minimum
        lows = blocks.amin(dim=1)
        scales, bottom, top = (blocks.amax(dim=1) - lows) / LEVELS[codec], 0, LEVELS[codec]
    else:                                    # levels -QMAX..QMAX around zero
        lows = None
        scales, bottom, top = blocks.abs().amax(dim=1) / QMAX[codec], -QMAX[codec], QMAX[codec]
    if not bool(torch.isfinite(scales).all()):
        return None
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    scaled = (blocks if lows is None else blocks - lows[:, None]) / safe[:, None]
    if generator is None:
        scaled = torch.round(scaled)
    else:
        noise = torch.rand(scaled.shape, generator=generator, device=scaled.device, dtype=scaled.dtype)
        scaled = torch.floor(scaled.add_(noise))
    q = scaled.clamp_(bottom, top)
    restored = q * scales[:, None] if lows is None else q * scales[:, None] + lows[:, None]
    restored = restored.view(-1)[:n]
    restored = from_channel_major(restored, tensor.shape) if channels else restored.view(tensor.shape)
    floats = [scales] if lows is None else [scales, lows]
    packed = torch.cat([f.contiguous().view(torch.uint8) for f in floats] + [_pack_levels(q, codec, n, offsets)])
    return header, tensor_codec.encode(packed), restored


def _pack_levels(q: torch.Tensor, codec: str, n: int, offsets: bool) -> torch.Tensor:
    """Bytes of the integer levels `q` (float, already clamped): int8 as one (signed, or with
    offsets unsigned) byte each; int4 two nibbles a byte, absmax levels stored + 8."""
    values = q.reshape(-1)[:n]
    if codec == "int8":
        return values.to(torch.uint8 if offsets else torch.int8).contiguous().view(torch.uint8)
    pad = 0 if offsets else 8
    nibbles = (values + pad).to(torch.uint8)
    if n % 2:
        nibbles = torch.cat([nibbles, nibbles.new_full((1,), pad)])
    return nibbles[0::2] | (nibbles[1::2] << 4)


def dequantise(header: Quantised, payload: TensorPayload, what: str = "tensor") -> torch.Tensor:
    """The float32 tensor a quantised payload holds. Raises BadTensor (code BAD_TENSOR) when
    the payload does not match its header or a scale is negative, NaN or infinite."""
    try:
        raw_scales, raw_offsets, raw_values = split(header, payload)
    except TensorError as exc:
        raise BadTensor(what, str(exc)) from None
    n = header.numel
    scales, lows = _floats(raw_scales), _floats(raw_offsets)
    raw = torch.frombuffer(bytearray(raw_values), dtype=torch.uint8) if len(raw_values) else \
        torch.zeros(0, dtype=torch.uint8)
    if header.codec == "int8":
        q = raw if header.offsets else raw.view(torch.int8)
    else:
        q = torch.stack([raw & 0x0F, raw >> 4], dim=1).view(-1)[:n].to(torch.int8)
        q = q if header.offsets else q - 8
    values = blocks_of(q.to(torch.float32), header.block) * scales[:, None]
    if header.offsets:
        values += lows[:, None]
    values = values.view(-1)[:n]
    return from_channel_major(values, header.shape) if header.channels else values.view(header.shape)


def _floats(raw: memoryview) -> torch.Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.float32) if len(raw) else torch.zeros(0, dtype=torch.float32)
