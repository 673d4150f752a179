"""Mixed precision of stage compute and the dtype tensors leave a stage in.

On CUDA the stage computes under bf16 autocast while its parameters, gradients and AdamW state
stay float32 (the "master" copy): StageRunner builds the module in float32 and only wraps the
forward in torch.autocast. Activations then travel in the compute dtype (half the bytes of
float32); the receiver casts them back to float32 before its own autocast region.

Gradients travel in bfloat16 only: float16 has 5 exponent bits, and small gradients (< 6e-8)
would flush to zero, so with --wire-dtype float16 gradients stay float32. A float16 activation
that would overflow (|x| > 65504) is sent as float32 rather than as Inf.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

WIRE_CHOICES = ("auto", "float32", "bfloat16", "float16")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ACCEPTED = frozenset(_DTYPES.values())          # what a stage takes in (then casts to float32)


@dataclass(frozen=True)
class Precision:
    autocast: torch.dtype | None      # compute dtype inside autocast; None: plain float32
    wire: torch.dtype                 # activations leave the stage in this dtype
    grad_wire: torch.dtype            # gradients leave the stage in this dtype

    def describe(self) -> str:
        ac = "fp32" if self.autocast is None else f"{_name(self.autocast)} autocast"
        return f"compute {ac}, master weights fp32, wire {_name(self.wire)} (grads {_name(self.grad_wire)})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve(device: str | torch.device, wire: str = "auto", autocast: bool | None = None) -> Precision:
    """autocast None: bf16 on CUDA, off elsewhere (CPU behaviour unchanged by default).
    wire "auto": the compute dtype."""
    if wire not in WIRE_CHOICES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_CHOICES)}: {wire!r}")
    use = torch.device(device).type == "cuda" if autocast is None else autocast
    compute = torch.bfloat16 if use else None
    act = (compute or torch.float32) if wire == "auto" else _DTYPES[wire]
    grad = act if act in (torch.float32, torch.bfloat16) else torch.float32
    return Precision(compute, act, grad)


def to_wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a float tensor for sending; float16 overflow falls back to the original dtype."""
    if not t.is_floating_point() or t.dtype == dtype:
        return t
    small = t.to(dtype)
    if dtype == torch.float16 and not bool(torch.isfinite(small).all()) and bool(torch.isfinite(t).all()):
        return t
    return small
