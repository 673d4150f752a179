"""Origins we still wait on for an iteration they have left behind.

A peer ends an iteration once every origin told it (IterationDone) that its microbatches of
that iteration ended. A peer that was stopped (SIGSTOP, a swap storm) or cut off while an
IterationDone came misses it, and would wait out the whole iteration timeout while the swarm
goes on without it; its replicas then wait for its gradient share, and the origins' next
microbatches queue behind it. The origins' own work tells the handlers when they moved on
(peer/pipeline/handlers.py); this is the backstop when none of their work comes our way:
each origin publishes its finished iterations on the DHT (the progress records the
coordinator reads), and an origin that reported iteration i or a later one is done with i.
"""
import asyncio
import logging
import time
from typing import Awaitable, Callable

from protocol.messages import ProgressRecord

from peer.pipeline.flights import IterationState

logger = logging.getLogger(__name__)

ProgressReader = Callable[[], Awaitable[dict[str, ProgressRecord]]]


class LaggingOrigins:
    """One iteration's backstop. `check()` is called on every pass of the work loop; it reads
    the progress records at most once per `every_s` (in the background, never blocking the
    loop), first `after_s` after the iteration started, and only while origins are missing."""

    MIN_WAIT_S = 3.0
    READ_TIMEOUT_S = 10.0

    def __init__(self, read_progress: ProgressReader | None, spawn: Callable[..., asyncio.Task],
                 wake: Callable[[], Awaitable[None]], typical_iteration_s: float = 0.0):
        self.read_progress, self.spawn, self.wake = read_progress, spawn, wake
        # a slow swarm's origins are slow, not gone: no reads before a normal iteration is over
        self.every_s = max(self.MIN_WAIT_S, typical_iteration_s)
        self.started = time.monotonic()
        self._last_read = self.started
        self._reading: asyncio.Task | None = None
        # set when every origin reported an iteration past ours and the next: the swarm is
        # there, and walking towards it one iteration (and one lone optimizer step) at a time
        # would take a read per iteration; the worker catches up with a replica's state instead
        self.swarm_at: int | None = None

    def check(self, i: int, st: IterationState, missing: set[str], origins: set[str] | None = None) -> None:
        """`missing`: the origins we still wait on for i; `origins`: all of the iteration's
        (for the catch-up; default: the missing ones)."""
        now = time.monotonic()
        if self.read_progress is None or not missing or now - self._last_read < self.every_s:
            return
        if self._reading is not None and not self._reading.done():
            return
        self._last_read = now
        self._reading = self.spawn(self._read(i, st, set(missing), set(origins or missing)),
                                   f"progress of origins of iteration {i}")

    async def _read(self, i: int, st: IterationState, missing: set[str], origins: set[str]) -> None:
        try:
            records = await asyncio.wait_for(self.read_progress(), self.READ_TIMEOUT_S)
        except Exception as exc:      # a slow DHT: the next check tries again
            logger.debug("reading the origins' progress failed: %s", exc)
            return
        moved_on = done_with(i, missing, records)
        newest = done_with(i + 1, origins, records)
        if origins and len(newest) == len(origins):
            # not also marking them done: that would end the iteration before the worker saw
            # this, and we would walk again, one read (~4 s) an iteration (seen in the storm bench)
            self.swarm_at = min(newest.values()) + 1
            await self.wake()
            return
        if not moved_on:
            return
        for origin, newest in moved_on.items():
            st.done_origins.add(origin)
            logger.warning("iteration %d: origin %s reported iteration %d already, so it is done with "
                           "ours (its IterationDone did not reach us)", i, origin[:12], newest)
        await self.wake()


def done_with(i: int, origins: set[str], records: dict[str, ProgressRecord]) -> dict[str, int]:
    """The origins whose own progress record shows iteration i or a later one finished: origin
    -> the newest iteration it reported. Only an origin's own record counts (the DHT's owner
    check ties each record to its signer), so nobody can end another's iteration early."""
    found = {}
    for origin in origins:
        record = records.get(origin)
        if record is None or record.peer_id != origin or not record.reports:
            continue
        newest = max(report.iteration for report in record.reports)
        if newest >= i:
            found[origin] = newest
    return found
