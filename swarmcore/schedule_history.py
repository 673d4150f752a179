"""Which schedule an iteration runs under, read the same way by the coordinator (to account
for an iteration's microbatches) and by every peer (to route them)."""
from typing import Sequence

from protocol.schedule import Route, Schedule


def schedule_for_iteration(schedules: Sequence[Schedule], iteration: int) -> Schedule | None:
    """The newest of `schedules` (oldest first) whose start_iteration is <= iteration."""
    for schedule in reversed(schedules):
        if schedule.start_iteration <= iteration:
            return schedule
    return None


def spot_check_receivers(route: Route, suspect: str, stage: int) -> set[str]:
    """Who may report a spot check of `suspect` at `stage` on `route`: the receiver of that hop's
    output (the next hop, or the origin after the last hop). The origin's own hop is never
    checked (its input is the data, not another peer's output)."""
    hops = route.hops
    return {(hops[k + 1] if k + 1 < len(hops) else hops[0]).peer
            for k in range(1, len(hops)) if hops[k].peer == suspect and hops[k].stage == stage}


def backward_check_receivers(route: Route, suspect: str, stage: int) -> set[str]:
    """Who may report a backward spot check of `suspect` at `stage` on `route`: the receiver of
    that hop's backward (the hop before it: the origin for the first hop)."""
    hops = route.hops
    return {hops[k - 1].peer for k in range(1, len(hops)) if hops[k].peer == suspect and hops[k].stage == stage}
