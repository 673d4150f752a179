"""Tensors as one flat float32 vector and back, in parameter order: gradient shares
(runner.grad_vector / set_grad_vector) and state transfer (state_transfer.py)."""
from collections.abc import Iterable, Sequence

import torch


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def split_like(vector: torch.Tensor, params: Sequence[torch.Tensor], offset: int = 0) -> list[torch.Tensor]:
    """Views of `vector` from `offset` on, one shaped like each of `params`."""
    out = []
    for p in params:
        out.append(vector[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    return out
