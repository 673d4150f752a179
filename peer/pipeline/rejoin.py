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
from typing import Awaitable, Callable, TypeVar

from peer.pipeline import plan_view as pv
from peer.pipeline.inbox import Inbox
from peer.pipeline.ledger import Ledger
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.seat import StageSeat
from peer.pipeline.state_sync import StateFetcher
from peer.routing.health import Health

logger = logging.getLogger(__name__)
REJOIN_WAIT_S = 60.0        # for the coordinator to re-plan with us after the heal
CATCH_UP_LEAD = 2           # iterations past the origins' newest reports that a lagging peer rejoins at
CATCH_UP_FETCH_S = 30.0     # for a replica's state then (the replicas wait for us meanwhile)
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


async def unless_cut_off(isolation: Isolation, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if we were cut off before it finished (it is cancelled).
    Cancelled itself (the work loop stopping), it cancels and awaits `work` too: an iteration
    must not outlive the loop that ran it."""
    task = asyncio.ensure_future(work)
    cut = asyncio.create_task(isolation.wait(True))
    try:
        await asyncio.wait({task, cut}, return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task.done() else None
    finally:
        for t in (task, cut):
            t.cancel()
        await asyncio.gather(task, cut, return_exceptions=True)


class Rejoin:
    """Joining a stage late, and sitting out a partition and coming back: on the worker's parts."""

    def __init__(self, me: str, isolation: Isolation, seat: StageSeat, ledger: Ledger, inbox: Inbox,
                 book: ScheduleBook, health: Health, fetcher: StateFetcher,
                 refresh_schedule: Callable[[], Awaitable[None]] | None):
        self.me, self.isolation, self.seat, self.ledger, self.inbox = me, isolation, seat, ledger, inbox
        self.book, self.health, self.fetcher, self.refresh_schedule = book, health, fetcher, refresh_schedule

    async def copy_state(self, schedule, stage: int, timeout_s: float | None = None) -> bool:
        """Late join (and rejoin): our stage's state as a live replica has it before the
        iteration in hand."""
        return await self.fetcher.fetch(schedule, stage, self.ledger.iteration, timeout_s)

    async def catch_up(self, i: int, swarm_at: int, schedule) -> None:
        """Every origin finished iterations past i: abandon i (no step: the replicas stepped
        without us), move to `swarm_at` and take the stage's state from a live replica, rather
        than walking there one iteration, and one lone optimizer step, at a time."""
        # two iterations ahead of the origins' newest reports (which lag a DHT read behind): the
        # replicas are not past it yet, and at its end they wait for our share, so their state
        # before it stays on offer while we fetch it
        target = swarm_at + CATCH_UP_LEAD
        logger.warning("fell behind the swarm (we are at iteration %d, every origin past %d): abandoning it "
                       "and catching up at iteration %d", i, swarm_at - 1, target)
        await self._abandon(i)
        self.ledger.iteration = max(self.ledger.iteration, target)
        self.inbox.drop_before(self.ledger.iteration)
        stage = self.seat.stage
        if stage is not None and len(pv.replicas(schedule, stage)) > 1 and not await self.copy_state(
                schedule, stage, CATCH_UP_FETCH_S):
            logger.error("no replica of stage %d gave its state after we fell behind: going on with ours, "
                         "which missed the steps since iteration %d", stage, i)
        self.seat.stepped_iteration = self.ledger.iteration - 1

    async def _abandon(self, i: int) -> None:
        if self.seat.runner is not None:
            await self.seat.compute(self.seat.runner.abandon)
        self.inbox.drop_before(i + 1)
        self.ledger.end(i)

    async def sit_out(self, i: int) -> None:
        """Abandon iteration i, wait until we are back, then move to where the swarm is."""
        try:
            await self._sit_out(i)
        finally:
            self.isolation.away = False

    async def _sit_out(self, i: int) -> None:
        logger.warning("cut off from the swarm: abandoning iteration %d (no step) until the network is back", i)
        await self._abandon(i)
        await self.isolation.wait(False)
        # every peer failed us while we were cut off: without this they would stay "unusable" to us
        # (suspect until a success we would never try), and we would refuse to route through them
        self.health.forget_failures()
        known = self.isolation.known_epoch or 0
        deadline = time.monotonic() + REJOIN_WAIT_S
        while time.monotonic() < deadline:
            if self.refresh_schedule is not None:
                try:
                    await asyncio.wait_for(self.refresh_schedule(), timeout=2.0)
                except Exception as exc:
                    logger.debug("schedule refresh failed: %s", exc)
            latest = self.book.latest
            if latest is not None and latest.epoch > known and self.me in latest.stage_of():
                await self._rejoin_at(latest)
                return
            await self.book.wait_changed(timeout=2.0)
        logger.warning("back in touch, but no schedule with us came within %.0fs; going on from iteration %d",
                       REJOIN_WAIT_S, self.ledger.iteration)

    async def _rejoin_at(self, schedule) -> None:
        ledger, seat = self.ledger, self.seat
        ledger.iteration = max(ledger.iteration, schedule.start_iteration)
        stage = schedule.stage_of()[self.me]
        logger.info("back in the swarm: rejoining at iteration %d (epoch %d)", ledger.iteration, schedule.epoch)
        self.isolation.away = False     # take work for that iteration now: it waits in the inbox meanwhile
        if stage == seat.stage and len(pv.replicas(schedule, stage)) > 1:
            await self.copy_state(schedule, stage)      # the replicas trained meanwhile
        seat.stepped_iteration = ledger.iteration - 1     # a new stage is set up by the worker loop
