"""The schedules this peer knows, and which one applies to a given iteration."""
import asyncio

from protocol.schedule import Schedule

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
        for schedule in reversed(self._schedules):
            if schedule.start_iteration <= iteration:
                return schedule
        return None

    async def wait_changed(self, timeout: float) -> bool:
        event = self._changed
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
