"""What spot checks (spot_checks.py, backward_checks.py) keep while the other half of a
comparison is on its way: halves, bounded in number and age."""
import collections
import time
from dataclasses import dataclass
from typing import Callable

import torch

from protocol.messages import WorkHeader

MAX_PENDING = 16           # halves waiting for their partner, each kind
PENDING_TTL_S = 60.0

Key = tuple[int, int, int, int]   # (iteration, microbatch, hop index, attempt)


def key_of(header: WorkHeader, hop: int | None = None) -> Key:
    return header.iteration, header.microbatch_id, header.hop_index if hop is None else hop, header.attempt


@dataclass
class Half:
    """One side of a comparison: what `peer` sent (the suspect's output, or the reference)."""

    peer: str
    tensor: torch.Tensor
    dtype: str                    # a float dtype, or the codec of a quantised tensor (int8, int4)
    at: float
    suspect: str = ""             # references only: whom the reference checks
    stage: int = 0
    block: int = 0                # a quantised tensor's elements per scale
    offsets: bool = False         # ... in min/max blocks (Quantised.offsets)
    channels: bool = False        # ... in channel blocks (Quantised.channels)


class Pending:
    """Halves waiting for their partner: at most `cap` of them, none older than `ttl_s`."""

    def __init__(self, cap: int = MAX_PENDING, ttl_s: float = PENDING_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.cap, self.ttl_s, self.clock = cap, ttl_s, clock
        self._items: collections.OrderedDict[Key, Half] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Key) -> bool:
        self._expire()
        return key in self._items

    def put(self, key: Key, half: Half) -> None:
        self._expire()
        self._items.pop(key, None)
        self._items[key] = half
        while len(self._items) > self.cap:
            self._items.popitem(last=False)   # the oldest goes: a check missed, nothing else

    def pop(self, key: Key) -> Half | None:
        self._expire()
        return self._items.pop(key, None)

    def drop_before(self, iteration: int) -> None:
        for key in [k for k in self._items if k[0] < iteration]:
            del self._items[key]

    def _expire(self) -> None:
        now = self.clock()
        while self._items and now - next(iter(self._items.values())).at > self.ttl_s:
            self._items.popitem(last=False)
