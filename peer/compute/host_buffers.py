"""Moving tensors between the transport (host memory) and the compute device.

Incoming tensors are staged in pinned (page-locked) host memory and copied to the GPU with
non_blocking=True, so the copy overlaps with whatever the stream is still running. Outgoing
tensors are cast to the wire dtype *on the GPU* (half the bytes to move), copied into a pinned
buffer without blocking, and the stream is synchronised once before the host tensor is handed
to the transport (which reads its bytes from another thread).

Pinned buffers come from torch's caching host allocator (`pin_memory=True`): freed buffers are
reused, and the allocator records the copy's stream, so a buffer is never recycled while a
copy from it is still in flight. On CPU every move is a no-op apart from the dtype casts.
"""
from __future__ import annotations

import torch

from peer.compute.precision import ACCEPTED, Precision, to_wire


class DeviceIO:
    def __init__(self, device: str | torch.device, precision: Precision, compute_dtype=torch.float32):
        self.device = torch.device(device)
        self.precision = precision
        self.compute_dtype = compute_dtype     # the master (parameter) dtype inputs are cast to
        self.pinned = self.device.type == "cuda"

    def to_compute(self, t):
        """A received float tensor (any accepted wire dtype, any device) -> compute device, float32.
        Anything else is returned untouched for the runner's own checks to reject."""
        if not isinstance(t, torch.Tensor) or t.dtype not in ACCEPTED:
            return t
        if self.pinned and t.device.type == "cpu":
            t = t.pin_memory()
        t = t.to(self.device, non_blocking=self.pinned)
        return t.to(self.compute_dtype)

    def to_host(self, t: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """A stage result -> host tensor in the wire dtype (activations) or grad_wire dtype."""
        t = to_wire(t.detach(), self.precision.grad_wire if grad else self.precision.wire)
        if t.device.type == "cpu":
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pinned)
        host.copy_(t, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.current_stream(t.device).synchronize()   # the bytes must be there for the sender
        return host
