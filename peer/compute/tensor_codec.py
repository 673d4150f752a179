"""torch.Tensor <-> protocol.tensors.TensorPayload: raw little-endian bytes, never pickle.

bfloat16 has no numpy dtype, so it travels as its 16-bit pattern (viewed as int16).
Optional wire compression casts floating tensors to float16 or bfloat16 before encoding; the
receiver casts back with decode(..., cast_to=...). A value that float16 cannot represent
(|x| > 65504) would become Inf, so such a tensor is sent uncompressed instead.
"""
from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch

from peer.compute.errors import BadTensor
from protocol.errors import ProtocolError
from protocol.tensors import TensorPayload

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
# numpy view used for the bytes; bfloat16 reuses int16's 2-byte little-endian layout.
_NUMPY = {"float32": "<f4", "float16": "<f2", "bfloat16": "<i2", "float64": "<f8",
          "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1",
          "bool": "?"}
WIRE_DTYPES = ("float16", "bfloat16")


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise BadTensor("tensor", f"dtype {dtype} cannot travel; one of {sorted(TORCH_DTYPES)}") from None


def encode(tensor: torch.Tensor, wire_dtype: str | None = None) -> TensorPayload:
    """Tensor -> payload. wire_dtype: None (as is), "float16" or "bfloat16" (floats only)."""
    t = tensor.detach()
    if wire_dtype is not None:
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES} or None: {wire_dtype!r}")
        if t.is_floating_point() and t.dtype != TORCH_DTYPES[wire_dtype]:
            small = t.to(TORCH_DTYPES[wire_dtype])
            if bool(torch.isfinite(small).all()) or not bool(torch.isfinite(t).all()):
                t = small
    name = dtype_name(t.dtype)
    t = t.cpu().contiguous()
    if name == "bfloat16":
        t = t.view(torch.int16)
    arr = t.numpy().astype(_NUMPY[name], copy=False)   # no-op on little-endian hosts
    return TensorPayload(name, tuple(int(d) for d in t.shape), arr.tobytes())


def _dtype_names(expect) -> set[str]:
    items = [expect] if isinstance(expect, (str, torch.dtype)) else list(expect)
    return {i if isinstance(i, str) else dtype_name(i) for i in items}


def decode(payload: TensorPayload, *, expect_shape: tuple[int | None, ...] | None = None,
           expect_dtype: str | torch.dtype | Collection[str | torch.dtype] | None = None,
           cast_to: torch.dtype | None = None, device: str | torch.device | None = None,
           what: str = "tensor") -> torch.Tensor:
    """Payload -> tensor, checking dtype and shape first (None in expect_shape = any size).

    Raises BadTensor (a ValueError) on any mismatch. The result owns its memory (writable).
    """
    if not isinstance(payload, TensorPayload):
        raise BadTensor(what, f"expected a TensorPayload, got {type(payload).__name__}")
    if expect_dtype is not None and payload.dtype not in _dtype_names(expect_dtype):
        raise BadTensor(what, f"dtype {payload.dtype}, expected {sorted(_dtype_names(expect_dtype))}")
    if expect_shape is not None:
        ok = len(expect_shape) == len(payload.shape) and all(
            e is None or e == d for e, d in zip(expect_shape, payload.shape))
        if not ok:
            raise BadTensor(what, f"shape {list(payload.shape)}, expected {list(expect_shape)}")
    if payload.dtype not in _NUMPY:
        raise BadTensor(what, f"unsupported dtype {payload.dtype!r}")
    try:
        arr = np.frombuffer(payload.data, dtype=_NUMPY[payload.dtype]).reshape(payload.shape)
    except (ValueError, ProtocolError) as e:
        raise BadTensor(what, f"bytes do not match dtype/shape: {e}") from None
    t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True))
    if payload.dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    if cast_to is not None:
        t = t.to(cast_to)
    return t if device is None else t.to(device)
