"""Sitting out a partition: a peer that is cut off from the swarm (peer/isolation.py noticed)
abandons the iteration in hand without stepping, trains nothing while it cannot reach anyone,
and once it is back rejoins like a late joiner: at the first schedule planned after it was
cut off that includes it again, with its stage's state copied from a live replica.

Abandoning keeps the books straight: the swarm already handled our share of that iteration
as a dead peer's (rerouted, skipped or lost: counted once, by the origins), so nothing we
computed alone may reach the swarm, and the replicas' state is the one that counts.
"""
import asyncio
import logging
import time
from typing import TYPE_CHECKING, Awaitable, TypeVar

from peer.pipeline import plan_view as pv
from peer.pipeline.state_sync import fetch_state

if TYPE_CHECKING:
    from peer.pipeline.worker import PipelineWorker

logger = logging.getLogger(__name__)
REJOIN_WAIT_S = 60.0        # for the coordinator to re-plan with us after the heal
T = TypeVar("T")


class Isolation:
    """Set by the isolation monitor; read by the worker."""

    def __init__(self):
        self.cut_off = False
        self.away = False                       # cut off, or back but not rejoined yet: no work
        self.known_epoch: int | None = None     # the newest epoch we had when we were cut off
        self._changed = asyncio.Event()

    def set(self, cut_off: bool, latest_epoch: int) -> None:
        if cut_off == self.cut_off:
            return
        if cut_off:
            self.known_epoch = latest_epoch
            self.away = True
        self.cut_off = cut_off
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, cut_off: bool) -> None:
        while self.cut_off != cut_off:
            await self._changed.wait()


async def unless_cut_off(w: "PipelineWorker", work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if we were cut off before it finished (it is cancelled)."""
    task = asyncio.ensure_future(work)
    cut = asyncio.create_task(w.isolation.wait(True))
    try:
        await asyncio.wait({task, cut}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cut.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def sit_out(w: "PipelineWorker", i: int) -> None:
    """Abandon iteration i, wait until we are back, then move to where the swarm is."""
    try:
        await _sit_out(w, i)
    finally:
        w.isolation.away = False


async def _sit_out(w: "PipelineWorker", i: int) -> None:
    logger.warning("cut off from the swarm: abandoning iteration %d (no step) until the network is back", i)
    if w.runner is not None:
        await w.compute(w.runner.abandon)
    w.end_iteration(i)
    await w.isolation.wait(False)
    # every peer failed us while we were cut off: without this they would stay "unusable" to us
    # (suspect until a success we would never try), and we would refuse to route through them
    w.health.forget_failures()
    known = w.isolation.known_epoch or 0
    deadline = time.monotonic() + REJOIN_WAIT_S
    while time.monotonic() < deadline:
        if w.refresh_schedule is not None:
            try:
                await asyncio.wait_for(w.refresh_schedule(), timeout=2.0)
            except Exception as exc:
                logger.debug("schedule refresh failed: %s", exc)
        latest = w.book.latest
        if latest is not None and latest.epoch > known and w.me in latest.stage_of():
            await _rejoin_at(w, latest)
            return
        await w.book.wait_changed(timeout=2.0)
    logger.warning("back in touch, but no schedule with us came within %.0fs; going on from iteration %d",
                   REJOIN_WAIT_S, w.iteration)


async def _rejoin_at(w: "PipelineWorker", schedule) -> None:
    w.iteration = max(w.iteration, schedule.start_iteration)
    stage = schedule.stage_of()[w.me]
    logger.info("back in the swarm: rejoining at iteration %d (epoch %d)", w.iteration, schedule.epoch)
    w.isolation.away = False     # take work for that iteration now: it waits in the inbox meanwhile
    if stage == w.stage and len(pv.replicas(schedule, stage)) > 1:
        await fetch_state(w, schedule, stage)      # the replicas trained while we were away
    w.stepped_iteration = w.iteration - 1          # a new stage is set up by the worker loop
