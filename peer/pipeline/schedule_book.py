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
    Other stages follow the epoch of the work they get, and take a new epoch whenever they read it."""

    def __init__(self):
        self._schedules: list[Schedule] = []   # increasing epoch
        self._changed = asyncio.Event()
        self._began_as_origin = -1             # the last iteration this peer began as an origin
        self._missed: set[int] = set()

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
        if schedule.start_iteration <= self._began_as_origin:
            self._missed.add(schedule.epoch)
            running = self._running_epoch()
            logger.warning("schedule epoch %d starts at iteration %d, which this peer began under epoch %d: "
                           "read too late, keeping epoch %d until the coordinator publishes another",
                           schedule.epoch, schedule.start_iteration, running, running)
        self._schedules.append(schedule)
        del self._schedules[:-KEEP_SCHEDULES]
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def for_iteration(self, iteration: int) -> Schedule | None:
        """The newest schedule whose start_iteration is <= iteration (of those not missed)."""
        return schedule_for_iteration([s for s in self._schedules if s.epoch not in self._missed], iteration)

    def began_as_origin(self, iteration: int) -> None:
        """This peer began `iteration` as an origin, under for_iteration(iteration)."""
        self._began_as_origin = max(self._began_as_origin, iteration)

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
