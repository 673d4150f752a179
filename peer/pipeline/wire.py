"""Compressed activations and gradients between hops (--wire-compression; protocol/quantised.py).

Sending: `WireCompression.compress` turns a float ForwardRequest/BackwardRequest into a
quantised one when
- our mode allows it: `off` never, `int8`/`int4` always that codec, `auto` (the default) the
  codec the schedule chose for the link from us to the receiver (Schedule.wire, the planner's
  choice per link), and
- the receiver reads quantised tensors: its replies told us it speaks protocol >= 1.6
  (RpcClient.versions). Until we have heard from a peer, and for a peer of an older version, the
  tensor travels as floats, as before: this is how an older peer gets uncompressed tensors.
int4 activations going forward travel in min/max blocks (Quantised.offsets) to a receiver that
reads them (protocol 1.11; absmax blocks to a 1.6-1.10 one): the held-out loss penalty of int4
about halves (bench/codec_study.py, docs/results.md); int8's error is small either way, and
gradients going back are centred on zero, where absmax loses little.
Every quantised tensor of two or more dimensions travels in channel blocks (Quantised.channels)
to a receiver that reads them (protocol 1.12): a block holds consecutive tokens of one channel,
whose range is far narrower than one token's across channels (a residual stream's channels
differ in mean and spread); int4's held-out loss penalty falls from +2.9% to +1.0% over 8 seeds
of bench/codec_study.py (gradients in channel blocks too: +1.0%, one rule both ways).
Gradients going back are rounded stochastically (STOCHASTIC_GRADIENTS; quantise.py): each
decodes to an unbiased estimate of the gradient, so the rounding errors of a stage's many
microbatches average out in its parameter gradients instead of adding up as a bias (round to
nearest is biased for every value between two levels). Activations going forward round to the
nearest level: the least error for the one forward pass that uses them, and what spot checks'
half-a-step tolerance assumes.
Error feedback on gradients going back is available but off by default (ERROR_FEEDBACK): what
quantisation dropped from one gradient sent over a link is added to the next one sent over it,
so the sum of what a link delivers tracks the sum of the gradients sent. But consecutive
gradients on a link belong to different microbatches, and the receiver backpropagates each
through its own microbatch's Jacobian, so a residual carried over is noise there, not a
correction: bench/compression.py's convergence runs (120 iterations, held-out loss vs floats)
measured int8 +2.1% and int4 +7.8% with it, +0.9% and +5.5% without.

Receiving: `received(request)` is what the handlers validate, `decode` the float32 tensor.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from peer.compute import quantise as q
from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from protocol import messages as m
from protocol.quantised import (CODECS, DEFAULT_BLOCK, OFFSET_CODECS, WIRE_COMPRESSION, Quantised,
                                has_channel_dimension, speaks_channels, speaks_offsets, speaks_quantised)
from protocol.schedule import Schedule
from protocol.tensors import TensorPayload

FLOAT_WIRE_DTYPES = ("float32", "float16", "bfloat16")
MAX_RESIDUALS = 32          # links with an error-feedback residual (each one activation's size)
ERROR_FEEDBACK = False      # see above: measured to hurt convergence across microbatches
STOCHASTIC_GRADIENTS = True  # see above: unbiased rounding of the gradients going back


def layout_for(codec: str, shape: tuple[int, ...], forward: bool,
               version: tuple[int, int] | None) -> tuple[bool, bool]:
    """(offsets, channels): the block layout of a `codec` tensor of `shape` between peers where the
    other side speaks `version` (the receiver's when we send, the sender's when we receive: we
    speak ours): min/max blocks for int4 going forward (1.11), channel blocks for every tensor
    with a channel dimension (1.12)."""
    offsets = forward and codec in OFFSET_CODECS and speaks_offsets(version)
    channels = has_channel_dimension(tuple(shape)) and speaks_channels(version)
    return offsets, channels


def link_codec(schedule: Schedule, sender: str, receiver: str) -> str:
    """The codec the schedule chose for sender -> receiver ("off": floats)."""
    for w in schedule.wire:
        if w.sender == sender and w.receiver == receiver:
            return w.codec
    return "off"


class WireCompression:
    def __init__(self, mode: str, versions: dict[str, tuple[int, int]], me: str,
                 block: int = DEFAULT_BLOCK, error_feedback: bool = ERROR_FEEDBACK,
                 stochastic_gradients: bool = STOCHASTIC_GRADIENTS, seed: int | None = None):
        if mode not in WIRE_COMPRESSION:
            raise ValueError(f"wire compression must be one of {WIRE_COMPRESSION}, not {mode!r}")
        self.mode, self.versions, self.me = mode, versions, me
        self.block, self.error_feedback = block, error_feedback
        self.stochastic_gradients, self.seed = stochastic_gradients, seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self.residuals: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.sent = {"off": 0, "int8": 0, "int4": 0}     # requests by codec, for status and tests
        self.sent_in_channel_blocks = 0                  # ... of the quantised ones (Quantised.channels)

    def codec_for(self, schedule: Schedule, receiver: str) -> str:
        if self.mode == "off" or not speaks_quantised(self.versions.get(receiver)):
            return "off"
        return link_codec(schedule, self.me, receiver) if self.mode == "auto" else self.mode

    def compress(self, request, tensor: torch.Tensor, schedule: Schedule, receiver: str):
        """`request` (floats) as it should travel to `receiver`: unchanged, or quantised."""
        return self.pack(request, tensor, schedule, receiver)[0]

    def pack(self, request, tensor: torch.Tensor, schedule: Schedule, receiver: str):
        """(the request as it travels to `receiver`, the float32 tensor it decodes to there, or
        None when it travels unchanged as floats)."""
        codec = self.codec_for(schedule, receiver)
        if codec not in CODECS or not tensor.is_floating_point():
            self.sent["off"] += 1
            return request, None
        backward = isinstance(request, m.BackwardRequest) and self.error_feedback
        residual = self.residuals.get(receiver) if backward else None
        if residual is not None and residual.shape == tensor.shape and residual.device == tensor.device:
            tensor = tensor.to(torch.float32) + residual
        stochastic = self.stochastic_gradients and isinstance(request, m.BackwardRequest)
        offsets, channels = layout_for(codec, tuple(tensor.shape), isinstance(request, m.ForwardRequest),
                                       self.versions.get(receiver))
        out = q.quantise(tensor, codec, self.block, self._generator(tensor.device) if stochastic else None, offsets,
                         channels)
        if out is None:                      # NaN or Inf: floats, refused by the receiver as before
            self.sent["off"] += 1
            return request, None
        header, payload, restored = out
        if backward:
            self.residuals[receiver] = tensor.to(torch.float32) - restored
            self.residuals.move_to_end(receiver)
            while len(self.residuals) > MAX_RESIDUALS:
                self.residuals.popitem(last=False)
        self.sent[codec] += 1
        self.sent_in_channel_blocks += channels
        return dataclasses.replace(request, tensor=payload, quantised=header), restored

    def _generator(self, device: torch.device) -> torch.Generator:
        """Our own random stream for stochastic rounding (the global one stays the model's)."""
        if device not in self._generators:
            gen = torch.Generator(device=device)
            if self.seed is None:
                gen.seed()
            else:
                gen.manual_seed(self.seed)
            self._generators[device] = gen
        return self._generators[device]


@dataclasses.dataclass(frozen=True)
class Packed:
    """A received quantised tensor; `dtype` names its codec (what spot checks' tolerance reads)."""

    header: Quantised
    payload: TensorPayload

    @property
    def dtype(self) -> str:
        return self.header.codec


def received(request) -> TensorPayload | Packed:
    """The tensor of a Forward/BackwardRequest as the handlers pass it on."""
    header = getattr(request, "quantised", None)
    return request.tensor if header is None else Packed(header, request.tensor)


def block_of(payload: TensorPayload | Packed) -> int:
    """Elements per scale of a received quantised tensor (0: floats)."""
    return payload.header.block if isinstance(payload, Packed) else 0


def has_offsets(payload: TensorPayload | Packed) -> bool:
    """Whether a received quantised tensor came in min/max blocks (Quantised.offsets)."""
    return isinstance(payload, Packed) and payload.header.offsets


def has_channels(payload: TensorPayload | Packed) -> bool:
    """Whether a received quantised tensor came in channel blocks (Quantised.channels)."""
    return isinstance(payload, Packed) and payload.header.channels


def layout_owed(header: Quantised, sender_version: tuple[int, int] | None, forward: bool) -> str | None:
    """What a quantised tensor from a sender of `sender_version` lacks of the layout such a sender
    uses with us (layout_for); None if nothing (or the sender's version is not known). A member
    that chose a coarser layout would get a coarser spot-check allowance to cheat in."""
    offsets, channels = layout_for(header.codec, header.shape, forward, sender_version)
    if channels and not header.channels:
        return "channel blocks"
    if offsets and not header.offsets:
        return "min/max blocks"
    return None


def decode(payload: TensorPayload | Packed, shape: tuple[int, ...], what: str,
           sender_version: tuple[int, int] | None = None, forward: bool = False) -> torch.Tensor:
    """float32 tensor of `shape`, or BadTensor. A float payload decodes exactly as before 1.6.
    `sender_version` (if known) and `forward`: a quantised one must come in its layout (layout_owed)."""
    if isinstance(payload, Packed):
        if payload.header.shape != tuple(shape):
            raise BadTensor(what, f"shape {list(payload.header.shape)}, expected {list(shape)}")
        owed = layout_owed(payload.header, sender_version, forward)
        if owed is not None:
            raise BadTensor(what, f"a peer of protocol {sender_version[0]}.{sender_version[1]} sends {owed}; "
                                  "this one came without")
        return q.dequantise(payload.header, payload.payload, what)
    return tensor_codec.decode(payload, expect_shape=shape, expect_dtype=FLOAT_WIRE_DTYPES,
                               cast_to=torch.float32, what=what)
