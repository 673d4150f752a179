"""Bulk requests to one peer go out one at a time, in the order they were sent.

Several activations for the same next hop used to be written at once, each stream taking a
share of the link: all of them then arrived together, as late as the last one, and the next
hop idled until then. With a lane per peer the first one arrives after its own bytes only,
so the next hop starts on it while the rest follow; the link carries the same bytes in the
same total time. This is the planner's link model too (coordinator/planner/simulate.py: a
directed link carries one transfer at a time, first come first served).

A lane is held only while a request's bytes are written (Transport.request's `on_sent`), not
for its reply, so latency still overlaps with the next transfer. Small requests (pings,
notices, acks) never wait in a lane: their bytes do not matter, their latency does.
"""
import asyncio
import time
from typing import Sequence

from peer.transport.base import Transport, TransportError

BULK_BYTES = 8 * 1024      # requests this large or larger queue in their peer's lane


class SendLanes:
    def __init__(self, transport: Transport, bulk_bytes: int = BULK_BYTES):
        self.transport, self.bulk_bytes = transport, bulk_bytes
        self._lanes: dict[str, asyncio.Lock] = {}

    async def request(self, peer: str, frames: Sequence[bytes], timeout: float) -> bytes:
        if sum(len(f) for f in frames) < self.bulk_bytes:
            return await self.transport.request(peer, frames, timeout)
        lane = self._lanes.setdefault(peer, asyncio.Lock())   # one per peer we ever sent to
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await lane.acquire()                          # asyncio.Lock wakes waiters FIFO
        except TimeoutError:
            raise TransportError(peer, f"no reply within {timeout:.1f}s (queued behind earlier sends)") from None
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                lane.release()
        try:
            left = max(0.01, timeout - (time.monotonic() - started))
            return await self.transport.request(peer, frames, left, on_sent=release)
        finally:
            release()                                         # failed or cancelled before the bytes left
