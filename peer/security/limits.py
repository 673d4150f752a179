"""Admission control for incoming RPCs: back-pressure instead of unbounded memory.

Checked before a request is read: per-peer token buckets (a bounded table), a cap on requests in
progress (in total and per peer: one peer gets a quarter of the slots), a budget for the bytes
half-received streams actually hold (in total and per peer: a quarter by default; reserved as
chunks arrive, never for what a stream merely declares), and a deadline for reading a whole
request (the transport also cuts a stream that sends nothing for a few seconds). A refused request costs the sender an OVERLOADED reply.
The per-peer limits alone do not stop a stranger with many peer ids (ids are free); the global
caps do, and with a join key strangers are refused before any of this (peer/security/membership).
"""
import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Awaitable, Callable


@dataclass(frozen=True)
class Limits:
    rate_per_s: float = 100.0          # sustained requests per second from one peer
    burst: int = 200                   # requests one peer may send at once after a quiet spell
    max_in_flight: int = 64            # requests being read or handled, all peers together
    max_in_flight_per_peer: int = 16   # a quarter: one peer cannot starve the others' pings
    stream_bytes_budget: int = 256 * 1024 * 1024   # bytes buffered by all half-received streams
    stream_bytes_per_peer: int = 0     # bytes one peer's streams may hold; 0 = a quarter of the budget
    request_deadline_s: float = 60.0   # a whole request (all its frames) must arrive within this
    max_tracked_peers: int = 4096      # token buckets kept (least recently seen dropped first)


class TokenBucket:
    def __init__(self, rate: float, burst: int, now: float):
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.stamp = float(burst), now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Overloaded(Exception):
    """Refused for back-pressure; the message says which limit."""


class Admission:
    """Not thread-safe: used from the peer's event loop only."""

    def __init__(self, limits: Limits = Limits(), clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self._buckets: collections.OrderedDict[str, TokenBucket] = collections.OrderedDict()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self.total_in_flight = 0
        self.stream_bytes = 0
        self._stream_bytes: collections.Counter[str] = collections.Counter()   # per remote peer
        self.refused = collections.Counter()   # reason -> count, for status and tests

    def enter(self, remote: str) -> None:
        """Admit one request from `remote` (call `leave(remote)` when done) or raise Overloaded."""
        lim = self.limits
        if self.total_in_flight >= lim.max_in_flight:
            self._refuse("busy", f"{self.total_in_flight} requests in progress; retry later")
        if self._in_flight[remote] >= lim.max_in_flight_per_peer:
            self._refuse("peer_busy", f"{self._in_flight[remote]} of your requests are in progress")
        if not self._bucket(remote).take(self.clock()):
            self._refuse("rate", f"over {lim.rate_per_s:.0f} requests/s; slow down")
        self._in_flight[remote] += 1
        self.total_in_flight += 1

    def leave(self, remote: str) -> None:
        self.total_in_flight -= 1
        self._in_flight[remote] -= 1
        if self._in_flight[remote] <= 0:
            del self._in_flight[remote]

    @property
    def stream_bytes_per_peer(self) -> int:
        return self.limits.stream_bytes_per_peer or max(1, self.limits.stream_bytes_budget // 4)

    def reserve_stream(self, nbytes: int, remote: str = "") -> None:
        """Reserve room for `nbytes` more of `remote`'s stream before buffering them
        (`release_stream` with the same arguments after)."""
        if self.stream_bytes + nbytes > self.limits.stream_bytes_budget:
            self._refuse("stream_bytes", f"{nbytes} more stream bytes would exceed the budget of "
                                         f"{self.limits.stream_bytes_budget}")
        if self._stream_bytes[remote] + nbytes > self.stream_bytes_per_peer:
            self._refuse("peer_stream_bytes", f"{nbytes} more stream bytes would exceed your share of "
                                              f"{self.stream_bytes_per_peer}")
        self.stream_bytes += nbytes
        self._stream_bytes[remote] += nbytes

    def release_stream(self, nbytes: int, remote: str = "") -> None:
        self.stream_bytes -= nbytes
        self._stream_bytes[remote] -= nbytes
        if self._stream_bytes[remote] <= 0:
            del self._stream_bytes[remote]

    def peer_stream_bytes(self, remote: str) -> int:
        return self._stream_bytes.get(remote, 0)

    def _bucket(self, remote: str) -> TokenBucket:
        bucket = self._buckets.get(remote)
        if bucket is None:
            bucket = TokenBucket(self.limits.rate_per_s, self.limits.burst, self.clock())
            self._buckets[remote] = bucket
            while len(self._buckets) > self.limits.max_tracked_peers:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(remote)
        return bucket

    def _refuse(self, reason: str, message: str):
        self.refused[reason] += 1
        raise Overloaded(message)


def coalesced(refresh: Callable[[], Awaitable[None]], min_interval_s: float = 0.5,
              clock: Callable[[], float] = time.monotonic) -> Callable[[], Awaitable[None]]:
    """Wrap a refresh that remote requests can trigger (e.g. re-reading the schedule from the
    DHT when a request names a newer epoch) so that callers share one run and it runs at most
    once per `min_interval_s`: a stranger's stream of made-up epochs cannot become a stream of
    DHT reads."""
    state: dict = {"task": None, "last": float("-inf")}

    async def wrapper() -> None:
        task = state["task"]
        if task is None:
            if clock() - state["last"] < min_interval_s:
                return
            state["last"] = clock()
            task = state["task"] = asyncio.ensure_future(refresh())
            task.add_done_callback(lambda _: state.update(task=None))
        await asyncio.shield(task)
    return wrapper
