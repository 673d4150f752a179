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

A peer checks a received tensor with `split` before it decodes a byte: the payload's dtype and
length against the header, and every scale finite and >= 0. Anything else is a TensorError (the
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
DEFAULT_BLOCK = 64                               # elements per scale, as SHARE_BLOCK
MIN_BLOCK, MAX_BLOCK = 8, 4096
QUANTISED_SINCE = (1, 6)                         # the first protocol version that reads these


@dataclass(frozen=True)
class Quantised:
    """How to read a request's quantised tensor (ForwardRequest/BackwardRequest.quantised)."""

    codec: str
    block: int
    shape: tuple[int, ...]

    def __post_init__(self):
        if self.codec not in CODECS:
            raise FieldError("codec", f"unknown codec {self.codec!r}; one of {list(CODECS)}")
        if not MIN_BLOCK <= self.block <= MAX_BLOCK:
            raise FieldError("block", f"must be in [{MIN_BLOCK}, {MAX_BLOCK}]")
        if len(self.shape) > MAX_NDIM or any(d < 0 for d in self.shape):
            raise FieldError("shape", f"at most {MAX_NDIM} non-negative dimensions")

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
    def packed_bytes(self) -> int:
        return 4 * self.scale_count + self.value_bytes


def bytes_per_element(codec: str, block: int = DEFAULT_BLOCK) -> float:
    """Wire bytes per element (values and their share of a scale); the planner prices links with it."""
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}")
    return (1.0 if codec == "int8" else 0.5) + 4.0 / block


def speaks_quantised(version: tuple[int, int] | None) -> bool:
    """Whether a peer that speaks `version` reads quantised tensors (None: not known yet)."""
    return version is not None and tuple(version) >= QUANTISED_SINCE


def split(header: Quantised, payload: TensorPayload) -> tuple[memoryview, memoryview]:
    """(scale bytes, value bytes) of a received quantised tensor, after checking that it is
    one flat uint8 payload of exactly the header's size with finite, non-negative scales.
    Raises TensorError (never anything else)."""
    if payload.dtype != "uint8" or len(payload.shape) != 1:
        raise TensorError(f"a quantised tensor travels as flat uint8, not {payload.dtype} {list(payload.shape)}")
    if payload.nbytes != header.packed_bytes:
        raise TensorError(f"quantised {header.codec} tensor of shape {list(header.shape)} in blocks of "
                          f"{header.block} needs {header.packed_bytes} bytes ({header.scale_count} scales), "
                          f"got {payload.nbytes}")
    data = memoryview(payload.data)
    cut = 4 * header.scale_count
    _check_scales(data[:cut])
    return data[:cut], data[cut:]


def _check_scales(raw: memoryview) -> None:
    scales = array("f")
    scales.frombytes(raw)
    if sys.byteorder == "big":
        scales.byteswap()
    if not scales:
        return
    # min() and fsum() loop in C: microseconds for thousands of scales. fsum is NaN if any
    # scale is NaN and Inf (or OverflowError / ValueError) if any is infinite.
    try:
        total = math.fsum(scales)
    except (OverflowError, ValueError):
        total = math.inf
    if not math.isfinite(total):
        raise TensorError("quantised tensor has a NaN or infinite block scale")
    if min(scales) < 0:
        raise TensorError("quantised tensor has a negative block scale")
