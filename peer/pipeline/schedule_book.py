"""The schedules this peer knows, and which one applies to a given iteration."""
import asyncio
import logging
from typing import Awaitable, Callable

from protocol.schedule import Schedule
from swarmcore.schedule_history import schedule_for_iteration

logger = logging.getLogger(__name__)

KEEP_SCHEDULES = 8


class StaleSchedule(Exception):
    pass


class ScheduleBook:
    """As an origin, this peer takes a new epoch only if it read it before it began the epoch's
    first iteration; read later, the epoch is *missed* and this peer keeps the one it runs until
    the coordinator publishes another (coordinator/epoch_uptake.py). Switching one iteration
    late would train samples of the old epoch that the new epoch's cursor hands out again.
    Other stages follow the origins: a new epoch read before they began its first iteration is
    taken; one read later is *late* here (kept aside) until work of it arrives, which shows the
    origins took it. Taken at once, an epoch published from an iteration the swarm had passed
    (the coordinator's view of the DHT was stale) made them refuse the origins' work of the
    epoch the origins kept (seen in CI: a partition test stalled a minute an iteration)."""

    def __init__(self):
        self._schedules: list[Schedule] = []   # increasing epoch
        self._changed = asyncio.Event()
        self._began_as_origin = -1             # the last iteration this peer began as an origin
        self._began = -1                       # ... in any role
        self._missed: set[int] = set()
        self._late: set[int] = set()           # read too late here, not (yet) seen run by the origins

    @property
    def latest(self) -> Schedule | None:
        return self._schedules[-1] if self._schedules else None

    def add(self, schedule: Schedule) -> bool:
        """Adopt a newer schedule; returns False for one we have; raises for an older epoch."""
        latest = self.latest
        if latest is not None:
            if schedule.epoch == latest.epoch:
                return False
            if schedule.epoch < latest.epoch:
                raise StaleSchedule(f"epoch {schedule.epoch} is older than our epoch {latest.epoch}")
        self._keep(schedule)
        return True

    def add_skipped(self, schedule: Schedule) -> bool:
        """An epoch older than our newest that we never read (we were stopped or cut off while
        it was current; the DHT's schedule key holds only the newest): the origins may run it,
        and we refused their work of it until the next epoch started. Returns whether it is new."""
        if not self._schedules or schedule.epoch >= self.latest.epoch or schedule.epoch < self._schedules[0].epoch \
                or any(s.epoch == schedule.epoch for s in self._schedules):
            return False
        self._keep(schedule)
        return True

    def _keep(self, schedule: Schedule) -> None:
        """Keep a newly read epoch (in epoch order, the newest KEEP_SCHEDULES) and wake waiters."""
        self._classify(schedule)
        self._schedules.append(schedule)
        if len(self._schedules) > 1 and schedule.epoch < self._schedules[-2].epoch:
            self._schedules.sort(key=lambda s: s.epoch)   # a skipped one, read after a newer
        del self._schedules[:-KEEP_SCHEDULES]
        self._changed.set()
        self._changed = asyncio.Event()

    def _classify(self, schedule: Schedule) -> None:
        """Set a newly read epoch aside as missed or late when we began its first iteration already."""
        if schedule.start_iteration <= self._began_as_origin:
            self._missed.add(schedule.epoch)
            running = self._running_epoch()
            logger.warning("schedule epoch %d starts at iteration %d, which this peer began under epoch %d: "
                           "read too late, keeping epoch %d until the coordinator publishes another",
                           schedule.epoch, schedule.start_iteration, running, running)
        elif schedule.start_iteration <= self._began:
            self._late.add(schedule.epoch)
            logger.info("schedule epoch %d starts at iteration %d, which this peer began already: "
                        "following the origins' epoch until their work shows which", schedule.epoch,
                        schedule.start_iteration)

    def for_iteration(self, iteration: int) -> Schedule | None:
        """The newest schedule whose start_iteration is <= iteration (of those not missed)."""
        return schedule_for_iteration([s for s in self._schedules
                                       if s.epoch not in self._missed and s.epoch not in self._late], iteration)

    def began(self, iteration: int, as_origin: bool) -> None:
        """This peer began `iteration` (as an origin or not), under for_iteration(iteration)."""
        self._began = max(self._began, iteration)
        if as_origin:
            self._began_as_origin = max(self._began_as_origin, iteration)

    def follow(self, epoch: int, iteration: int) -> None:
        """Work of `epoch` for `iteration` arrived from the origins' side: an epoch late here
        that covers the iteration is theirs, so ours from now on."""
        if epoch not in self._late:
            return   # every request passes here: the common case costs a set lookup
        schedule = next((s for s in self._schedules if s.epoch == epoch), None)
        if schedule is not None and schedule.start_iteration <= iteration:
            self._late.discard(epoch)
            logger.info("the origins run epoch %d at iteration %d: following it", epoch, iteration)

    def missed(self, epoch: int) -> bool:
        return epoch in self._missed

    def missed_after(self, epoch: int) -> bool:
        """Whether we keep `epoch` although we missed a newer one: peers that took the newer one
        refuse our work of it (STALE_SCHEDULE) until the coordinator publishes another."""
        return any(missed > epoch for missed in self._missed)

    def _running_epoch(self) -> int:
        running = self.for_iteration(self._began_as_origin)
        return -1 if running is None else running.epoch

    async def wait_changed(self, timeout: float) -> bool:
        event = self._changed
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False


class BoundaryRead:
    """The schedule read at each iteration boundary (a new epoch may start with the next
    iteration): started as soon as the iteration's own work ends, so that it overlaps the
    gradient exchange (a DHT read on a busy swarm can take a second), and awaited before the
    next iteration starts. `refresh()` returns the current refresh function (None: none)."""

    READ_TIMEOUT_S = 2.0

    def __init__(self, refresh: Callable[[], Callable[[], Awaitable[None]] | None],
                 spawn: Callable[[Awaitable[None]], asyncio.Task]):
        self.refresh, self.spawn = refresh, spawn
        self._read: asyncio.Task | None = None

    def start(self) -> None:
        fn = self.refresh()
        if fn is not None and self._read is None:
            self._read = self.spawn(self._bounded(fn))

    async def finish(self) -> None:
        self.start()
        read, self._read = self._read, None
        if read is not None:
            await read

    async def _bounded(self, fn: Callable[[], Awaitable[None]]) -> None:
        try:
            await asyncio.wait_for(fn(), timeout=self.READ_TIMEOUT_S)
        except Exception as exc:
            logger.debug("schedule refresh failed: %s", exc)
