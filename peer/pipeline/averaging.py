"""Same-stage replica averaging: each replica sends its summed gradients and sample count to
the others; every replica adds all contributions in peer-id order, so all end bit-identical.

Normalisation is by the total samples that reached the stage (not by the replica count).
A replica that does not answer in time is left out of this iteration, and logged.
"""
import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from protocol.messages import GradientShare

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contribution:
    vector: torch.Tensor
    samples: int
    loss_sum: float = 0.0


@dataclass(frozen=True)
class AveragingResult:
    vector: torch.Tensor
    samples: int
    loss_sum: float
    peers: tuple[str, ...]            # contributors, including ourselves
    missing: tuple[str, ...]


class ShareBox:
    """Shares received from other replicas, keyed by (iteration, stage)."""

    def __init__(self, max_pending_iterations: int = 3):
        self.max_pending = max_pending_iterations
        self._shares: dict[tuple[int, int], dict[str, Contribution]] = {}
        self._changed = asyncio.Condition()

    async def add(self, sender: str, share: GradientShare, vector: torch.Tensor) -> None:
        async with self._changed:
            box = self._shares.setdefault((share.iteration, share.stage), {})
            box[sender] = Contribution(vector, share.samples, share.loss_sum)
            self._changed.notify_all()

    async def collect(self, iteration: int, stage: int, senders: set[str], timeout: float,
                      gone: Callable[[str], bool] = lambda peer: False,
                      recheck_s: float = 0.5) -> dict[str, Contribution]:
        """Shares of `senders` for (iteration, stage), waiting until all arrived, `timeout`
        passed, or the missing ones are `gone` (re-evaluated every `recheck_s`)."""
        key = (iteration, stage)
        deadline = asyncio.get_running_loop().time() + timeout

        def complete() -> bool:
            have = set(self._shares.get(key, {}))
            return all(p in have or gone(p) for p in senders)

        async with self._changed:
            while not complete():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(min(left, recheck_s)):
                        await self._changed.wait_for(complete)
                except TimeoutError:
                    pass
            got = self._shares.pop(key, {})
            for old in [k for k in self._shares if k[0] <= iteration]:
                del self._shares[old]
            return {p: c for p, c in got.items() if p in senders}


def combine(contributions: dict[str, Contribution], expected: list[str]) -> AveragingResult:
    peers = tuple(sorted(contributions))
    total = None
    for peer in peers:  # fixed order: floating-point sums then agree on every replica
        v = contributions[peer].vector
        total = v.clone() if total is None else total.add_(v)
    return AveragingResult(
        vector=total, samples=sum(c.samples for c in contributions.values()),
        loss_sum=sum(contributions[p].loss_sum for p in peers), peers=peers,
        missing=tuple(p for p in expected if p not in contributions))
