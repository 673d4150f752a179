"""Compressed activations and gradients on the wire (protocol 1.6): the layout and its checks.

A quantised tensor travels as a flat uint8 TensorPayload (so the RPC layer chunks and streams
it like any other) whose bytes are
    [one float32 scale per block, little-endian] [the values]
and the request's `quantised` header says how to read them: the codec, the block size and the
tensor's shape. Blockwise absmax, as the replicas' int8 gradient shares: each block of `block`
consecutive elements (row-major) keeps its own range, so one large value costs precision only in
its block. Element x of a block with scale s travels as round(x / s), s = absmax(block) / QMAX:
- int8: one signed byte per element, in [-127, 127];
- int4: one nibble per element, value + 8 in [1, 15]; element 2j in the low nibble of byte j,
  2j + 1 in the high one (an odd count pads the last high nibble with 8, a zero).
With `offsets` (protocol 1.11, min/max blocks; senders use it for int4 activations going forward,
to peers that speak 1.11): after the scales come as many float32 offsets, the blocks' minima,
and element x of a block with minimum lo and scale s = (max - lo) / LEVELS travels as the
unsigned level round((x - lo) / s), decoded as lo + level x s: int8 one byte in [0, 255], int4
one nibble in [0, 15] (odd counts pad with 0). Every level is used where absmax leaves one
unused and spends half of them on a sign the block may not have: the trained activations' error
is 26% smaller, and bench/codec_study.py's int4 training loss penalty about halves.

With `channels` (protocol 1.12; senders use it for every quantised tensor of two or more
dimensions, to peers that speak 1.12): the blocks run along a channel instead of along a token.
The tensor of shape (..., C) is read as N = numel / C rows of C channels and quantised in its
transpose, (C, N) row-major: element (n, c) is element c * N + n of the blocked sequence (so a
block holds `block` consecutive tokens of one channel). A trained residual stream's channels
differ in mean and spread (std over 3x apart, means 0.7 std off zero) far more than one
token's values do along the channels: the int4 activations' squared error is 42% smaller in
channel blocks, and bench/codec_study.py's int4 training loss penalty falls by two thirds.

A peer checks a received tensor with `split` before it decodes a byte: the payload's dtype and
length against the header, every scale finite and >= 0, every offset finite. Anything else is a TensorError (the
BAD_TENSOR reply), like any inconsistent tensor. Torch-free: the arithmetic is the peer's
(peer/compute/quantise.py); this module is the contract both sides read.
"""
import math
import sys
from array import array
from dataclasses import dataclass

from protocol.errors import FieldError, TensorError
from protocol.tensors import MAX_NDIM, TensorPayload

CODECS = ("int8", "int4")                        # what a link may carry besides floats
WIRE_COMPRESSION = ("auto", "off") + CODECS      # the --wire-compression choices
QMAX = {"int8": 127, "int4": 7}
LEVELS = {"int8": 255, "int4": 15}               # with offsets: the top unsigned level
DEFAULT_BLOCK = 64                               # elements per scale, as SHARE_BLOCK
MIN_BLOCK, MAX_BLOCK = 8, 4096
QUANTISED_SINCE = (1, 6)                         # the first protocol version that reads these
OFFSETS_SINCE = (1, 11)                          # ... and min/max blocks (Quantised.offsets)
OFFSET_CODECS = ("int4",)                        # whose activations senders put in min/max blocks
CHANNELS_SINCE = (1, 12)                         # ... and channel blocks (Quantised.channels)


@dataclass(frozen=True)
class Quantised:
    """How to read a request's quantised tensor (ForwardRequest/BackwardRequest.quantised)."""

    codec: str
    block: int
    shape: tuple[int, ...]
    offsets: bool = False       # v1.11: min/max blocks (an older peer drops it: never sent to one)
    channels: bool = False      # v1.12: blocks along the last dimension's channels (likewise)

    def __post_init__(self):
        if self.codec not in CODECS:
            raise FieldError("codec", f"unknown codec {self.codec!r}; one of {list(CODECS)}")
        if not MIN_BLOCK <= self.block <= MAX_BLOCK:
            raise FieldError("block", f"must be in [{MIN_BLOCK}, {MAX_BLOCK}]")
        if len(self.shape) > MAX_NDIM or any(d < 0 for d in self.shape):
            raise FieldError("shape", f"at most {MAX_NDIM} non-negative dimensions")
        if self.channels and not has_channel_dimension(self.shape):
            raise FieldError("channels", "channel blocks need a shape of two or more dimensions, the last not empty")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def scale_count(self) -> int:
        return -(-self.numel // self.block)

    @property
    def value_bytes(self) -> int:
        return self.numel if self.codec == "int8" else -(-self.numel // 2)

    @property
    def float_count(self) -> int:
        """Scales, and offsets if any: the float32s before the values."""
        return self.scale_count * (2 if self.offsets else 1)

    @property
    def packed_bytes(self) -> int:
        return 4 * self.float_count + self.value_bytes


def bytes_per_element(codec: str, block: int = DEFAULT_BLOCK, offsets: bool = False) -> float:
    """Wire bytes per element (values and their share of a scale, and of an offset); the planner
    prices links with it."""
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}")
    return (1.0 if codec == "int8" else 0.5) + (8.0 if offsets else 4.0) / block


def speaks_quantised(version: tuple[int, int] | None) -> bool:
    """Whether a peer that speaks `version` reads quantised tensors (None: not known yet)."""
    return version is not None and tuple(version) >= QUANTISED_SINCE


def speaks_offsets(version: tuple[int, int] | None) -> bool:
    """Whether a peer that speaks `version` reads min/max blocks (Quantised.offsets)."""
    return version is not None and tuple(version) >= OFFSETS_SINCE


def has_channel_dimension(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` can travel in channel blocks: two or more dimensions, the last
    (the channels) not empty."""
    return len(shape) >= 2 and shape[-1] > 0


def speaks_channels(version: tuple[int, int] | None) -> bool:
    """Whether a peer that speaks `version` reads channel blocks (Quantised.channels)."""
    return version is not None and tuple(version) >= CHANNELS_SINCE


def split(header: Quantised, payload: TensorPayload) -> tuple[memoryview, memoryview, memoryview]:
    """(scale bytes, offset bytes (empty without offsets), value bytes) of a received quantised
    tensor, after checking that it is one flat uint8 payload of exactly the header's size with
    finite, non-negative scales and finite offsets. Raises TensorError (never anything else)."""
    if payload.dtype != "uint8" or len(payload.shape) != 1:
        raise TensorError(f"a quantised tensor travels as flat uint8, not {payload.dtype} {list(payload.shape)}")
    if payload.nbytes != header.packed_bytes:
        floats = f"{header.scale_count} scales" + (" and as many offsets" if header.offsets else "")
        raise TensorError(f"quantised {header.codec} tensor of shape {list(header.shape)} in blocks of "
                          f"{header.block} needs {header.packed_bytes} bytes ({floats}), got {payload.nbytes}")
    data = memoryview(payload.data)
    cut, end = 4 * header.scale_count, 4 * header.float_count
    _check_floats(data[:cut], "block scale", signed=False)
    _check_floats(data[cut:end], "block offset", signed=True)
    return data[:cut], data[cut:end], data[end:]


def _check_floats(raw: memoryview, what: str, signed: bool) -> None:
    values = array("f")
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    if not values:
        return
    # min() and fsum() loop in C: microseconds for thousands of scales. fsum is NaN if any
    # scale is NaN and Inf (or OverflowError / ValueError) if any is infinite.
    # (of the absolute values for offsets: +inf and -inf must not cancel into a finite sum)
    try:
        total = math.fsum(map(abs, values) if signed else values)
    except (OverflowError, ValueError):
        total = math.inf
    if not math.isfinite(total):
        raise TensorError(f"quantised tensor has a NaN or infinite {what}")
    if not signed and min(values) < 0:
        raise TensorError(f"quantised tensor has a negative {what}")
