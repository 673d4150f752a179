"""A control for bench/compression.py's convergence runs: floats that differ from the exact ones by
a rounding far below any codec's (an int16 grid per block of 64 values, relative error ~1e-5).

The tiny model's 120-iteration held-out loss is chaotic in the wire's values: a change this small
moves it about as much as int8 does (docs/results.md). Running this control beside off, int8 and
int4 shows how much of a codec's figure any perturbation would give.
"""
import contextlib
import dataclasses

import torch

from peer.compute import tensor_codec
from peer.pipeline import wire

JITTER_QMAX = 32767
BLOCK = 64


def jitter(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().to(torch.float32).reshape(-1)
    pad = -flat.numel() % BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1, keepdim=True) / JITTER_QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(blocks / scale) * scale).view(-1)[:flat.numel()].view(tensor.shape)


@contextlib.contextmanager
def jittered_floats():
    """While active, every link a peer would compress (mode int8) carries jittered floats instead."""
    original = wire.WireCompression.pack

    def pack(self, request, tensor, schedule, receiver):
        if self.codec_for(schedule, receiver) == "off" or not tensor.is_floating_point():
            return original(self, request, tensor, schedule, receiver)
        self.sent["off"] += 1
        return dataclasses.replace(request, tensor=tensor_codec.encode(jitter(tensor))), None
    wire.WireCompression.pack = pack
    try:
        yield
    finally:
        wire.WireCompression.pack = original
