"""Replicas' gradient shares on the wire (--share-dtype), and their checks on arrival.

- float32: exact (4 bytes a parameter);
- float16: half the bytes; a vector float16 cannot hold travels as float32;
- int8: blockwise absmax quantisation, about a quarter of the bytes (1 byte a parameter plus
  one float32 scale per SHARE_BLOCK of them, GradientShare.scales), as volunteer training
  swarms compress what replicas exchange: each block keeps its own range, so one large
  gradient costs precision only in its block. A vector with a NaN or Inf travels as float32
  (and the receiver rejects it, as before).
Every replica adds what travelled, its own share included (encode_share returns it), so
all replicas step with the same sum and stay bit-identical whatever the dtype.
"""
import torch

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from protocol.messages import SHARE_BLOCK
from protocol.tensors import TensorPayload

FLOAT_SHARE_DTYPES = ("float32", "float16")     # the dtypes that travel without scales
SHARE_BYTES = {"float32": 4.0, "float16": 2.0, "int8": 1.0 + 4.0 / SHARE_BLOCK}   # per parameter


def block_count(n: int) -> int:
    return -(-n // SHARE_BLOCK)


def _quantise(vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per block) of a finite float32 vector."""
    n = vector.numel()
    padded = torch.zeros(block_count(n) * SHARE_BLOCK, dtype=torch.float32)
    padded[:n] = vector
    blocks = padded.view(-1, SHARE_BLOCK)
    scales = blocks.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return values.view(-1)[:n].clone(), scales


def _dequantise(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n = values.numel()
    return values.to(torch.float32) * scales.repeat_interleave(SHARE_BLOCK)[:n]


def encode_share(vector: torch.Tensor, wire_dtype: str) -> tuple[TensorPayload, TensorPayload | None, torch.Tensor]:
    """Our gradients as they travel (payload, scales or None), and as float32 what every
    other replica will decode from them: we add that, not our exact vector."""
    vector = vector.detach().to(torch.float32).reshape(-1)
    if wire_dtype == "int8" and bool(vector.isfinite().all()):
        values, scales = _quantise(vector)
        return tensor_codec.encode(values), tensor_codec.encode(scales), _dequantise(values, scales)
    payload = tensor_codec.encode(vector, "float16" if wire_dtype == "float16" else None)
    if payload.dtype == "float32":
        return payload, None, vector
    return payload, None, tensor_codec.decode(payload, cast_to=torch.float32, what="gradient share")


def decode_share(tensor: TensorPayload, scales: TensorPayload | None, n: int) -> torch.Tensor:
    """A received share as float32, after checking it holds `n` parameters in a share dtype
    and (int8) one finite, non-negative scale per block. Raises BadTensor."""
    what = "gradient share"
    if tensor.dtype == "int8":
        values = tensor_codec.decode(tensor, expect_shape=(n,), expect_dtype="int8", what=what)
        if scales is None:
            raise BadTensor(what, "int8 share without its block scales")
        s = tensor_codec.decode(scales, expect_shape=(block_count(n),), expect_dtype="float32",
                                what="gradient share scales")
        if not bool(s.isfinite().all()) or bool((s < 0).any()):
            raise BadTensor("gradient share scales", "scales must be finite and >= 0")
        return _dequantise(values, s)
    if scales is not None:
        raise BadTensor(what, f"a {tensor.dtype} share carries no block scales")
    return tensor_codec.decode(tensor, expect_shape=(n,), expect_dtype=FLOAT_SHARE_DTYPES,
                               cast_to=torch.float32, what=what)
