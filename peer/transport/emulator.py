"""A link emulator around any Transport: slow, far-apart networks on one machine.

Each request to a peer pays, before it is sent, the transmission time of its bytes on our
link to that peer (bandwidth shared fairly by all concurrent sends on the link) and then the
link's one-way latency; the reply pays the same on the reverse link. This is the simulator's
model (coordinator/planner/simulate.py: arrive = begin + bytes / bandwidth + latency), except
that bandwidth is shared processor-style instead of first come first served. We cannot use tc
netem here (no kernel module), so the delay lives in the transport.

The reverse link is modelled by the requester only: replies from a peer to us do not share
bandwidth with that peer's own requests to us. Pipeline replies are small acks, so this is
a minor gap; it is the price of needing no cooperation from the remote side.
"""
import asyncio
import logging
import math
import time
from typing import Callable, Sequence

from peer.transport.base import Handler, OnSent, Transport, TransportError

logger = logging.getLogger(__name__)
# (latency_s, bandwidth_bytes_s) of the directed link us -> peer and peer -> us, or None
LinkLookup = Callable[[str], tuple[tuple[float, float], tuple[float, float]] | None]


class SharedLink:
    """One directed link: concurrent transfers share `bandwidth` bytes/s equally (fluid model)."""

    def __init__(self, bandwidth_bytes_s: float, clock: Callable[[], float] = time.monotonic):
        if not bandwidth_bytes_s > 0:
            raise ValueError(f"bandwidth must be > 0, got {bandwidth_bytes_s}")
        self.bandwidth, self.clock = bandwidth_bytes_s, clock
        self.active: dict[asyncio.Future, float] = {}   # transfer -> bytes still to send
        self._last = clock()
        self._timer: asyncio.TimerHandle | None = None

    async def transfer(self, nbytes: int) -> None:
        if nbytes <= 0 or math.isinf(self.bandwidth):
            return
        self._advance()
        done = asyncio.get_running_loop().create_future()
        self.active[done] = float(nbytes)
        self._reschedule()
        try:
            await done
        finally:
            if done in self.active:       # cancelled mid-transfer: free its share
                self._advance()
                del self.active[done]
                self._reschedule()

    def _advance(self) -> None:
        now = self.clock()
        if self.active:
            sent = self.bandwidth * (now - self._last) / len(self.active)
            for f in self.active:
                self.active[f] -= sent
        self._last = now

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for f in [f for f, left in self.active.items() if left <= 1e-6]:
            del self.active[f]
            if not f.done():
                f.set_result(None)
        if self.active:
            wait = min(self.active.values()) * len(self.active) / self.bandwidth
            self._timer = asyncio.get_running_loop().call_later(wait, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._advance()
        self._reschedule()


class EmulatedTransport(Transport):
    """Delays `inner`'s requests as the emulated links dictate; peers `links` does not know
    are reached without delay."""

    def __init__(self, inner: Transport, links: LinkLookup):
        self.inner, self.links = inner, links
        self.peer_id = inner.peer_id
        self._out: dict[str, SharedLink] = {}
        self._back: dict[str, SharedLink] = {}

    def __getattr__(self, name):  # p2p and other extras of the real transport
        return getattr(self.inner, name)

    def _link(self, table: dict[str, SharedLink], peer: str, bandwidth: float) -> SharedLink:
        link = table.get(peer)
        if link is None:
            link = table[peer] = SharedLink(bandwidth)
        return link

    async def request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent = None) -> bytes:
        found = self.links(peer)
        if found is None:
            return await self.inner.request(peer, frames, timeout, on_sent)
        (lat_out, bw_out), (lat_back, bw_back) = found
        deadline = time.monotonic() + timeout
        try:
            async with asyncio.timeout(timeout):
                await self._link(self._out, peer, bw_out).transfer(sum(len(f) for f in frames))
                if on_sent is not None:      # the bytes are on the (emulated) wire
                    on_sent()
                await asyncio.sleep(lat_out)
                reply = await self.inner.request(peer, frames, max(0.01, deadline - time.monotonic()))
                await self._link(self._back, peer, bw_back).transfer(len(reply))
                await asyncio.sleep(lat_back)
                return reply
        except TimeoutError:
            raise TransportError(peer, f"no reply within {timeout:.1f}s (emulated link)") from None

    async def serve(self, handler: Handler) -> None:
        await self.inner.serve(handler)

    async def close(self) -> None:
        await self.inner.close()
