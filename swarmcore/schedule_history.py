"""Which schedule an iteration runs under, read the same way by the coordinator (to account
for an iteration's microbatches) and by every peer (to route them)."""
from typing import Sequence

from protocol.schedule import Schedule


def schedule_for_iteration(schedules: Sequence[Schedule], iteration: int) -> Schedule | None:
    """The newest of `schedules` (oldest first) whose start_iteration is <= iteration."""
    for schedule in reversed(schedules):
        if schedule.start_iteration <= iteration:
            return schedule
    return None
