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
    def __init__(self):
        self._schedules: list[Schedule] = []   # increasing epoch
        self._changed = asyncio.Event()

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
        self._schedules.append(schedule)
        del self._schedules[:-KEEP_SCHEDULES]
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def for_iteration(self, iteration: int) -> Schedule | None:
        """The newest schedule whose start_iteration is <= iteration."""
        return schedule_for_iteration(self._schedules, iteration)

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
