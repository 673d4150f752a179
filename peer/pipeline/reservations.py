"""The peers' half of the one order rule (coordinator/planner/simulate.py plays the same): of
the ready tasks the first-listed runs and the peer never idles, but a forward starts only if the
activation slots left also cover every forward listed before it that has not started yet. So
running out of order never takes a slot the planned order counts on, which is what lets the
planner predict (and keep deadlock-free) what peers do.

A listed forward may never come (its microbatch was rerouted or lost), so a forward held back
by reservations alone for longer than `patience_s` starts anyway: the order is a plan, not a
promise, and a slot held for a ghost would stall this peer until the iteration times out.
"""
import bisect
import time
from typing import Callable

from peer.pipeline.plan_view import Kind, TaskKey

FORWARD_SLOT = "F"


class ForwardReservations:
    def __init__(self, planned: dict[tuple[int, str], float], patience_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self._planned = planned
        self._waiting = sorted(pos for (_, slot), pos in planned.items() if slot == FORWARD_SLOT)
        self._patience_s, self._clock = patience_s, clock
        self._held_back_since: dict[TaskKey, float] = {}

    def reserved_before(self, task: TaskKey) -> int:
        """Listed forwards, not started yet, that the order runs before `task`."""
        rank = self._planned.get((task.microbatch_id, FORWARD_SLOT), float("inf"))
        return bisect.bisect_left(self._waiting, rank)

    def allows(self, task: TaskKey, stashed: int, limit: int) -> bool:
        if not task.kind.is_forward:
            return True
        if stashed >= limit:
            return False
        if stashed + self.reserved_before(task) < limit:
            return True
        since = self._held_back_since.setdefault(task, self._clock())
        return self._clock() - since >= self._patience_s

    def started(self, task: TaskKey) -> None:
        """`task` runs now: its own reservation (if the order lists it) is used up."""
        self._held_back_since.pop(task, None)
        if task.kind not in (Kind.FORWARD, Kind.ORIGIN_FORWARD):
            return
        rank = self._planned.get((task.microbatch_id, FORWARD_SLOT))
        if rank is not None:
            i = bisect.bisect_left(self._waiting, rank)
            if i < len(self._waiting) and self._waiting[i] == rank:
                self._waiting.pop(i)
