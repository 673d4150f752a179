"""Whether each published epoch reached its origins in time.

An origin takes a new epoch only if it read it before it began the epoch's first iteration
(peer/pipeline/schedule_book.py): one read later it keeps the old epoch, so that an iteration's
samples are never those of two epochs at once (a late origin that switched one iteration in
used to train old-epoch samples that the new epoch's cursor handed out again). The origins'
progress reports for that first iteration name the epoch they ran, and tell the coordinator:
- all of them ran it: taken;
- none did: *missed*. It never takes effect: the data cursor goes on from the epoch they ran,
  and the missed epoch's retries move to the next one;
- some did: split. The origins that missed it keep the old epoch, so the swarm is out of step.
A missed or split epoch is published again, with the same routes, from a later iteration;
each late switch in a row doubles the margin of the next (the DHT is slower than the margin).
"""
import logging
from dataclasses import dataclass, field
from typing import Sequence

from protocol.schedule import Schedule

logger = logging.getLogger(__name__)

MAX_MARGIN_DOUBLINGS = 3


@dataclass
class EpochUptake:
    missed: set[int] = field(default_factory=set)     # epochs that never took effect
    judged: set[int] = field(default_factory=set)
    late_in_a_row: int = 0

    def judge(self, schedules: Sequence[Schedule], iteration: int, ran_epochs: set[int]) -> list[str]:
        """Judge every epoch whose first iteration `iteration` is (or passed), from the epochs
        its origins reported; returns why the swarm needs a new epoch (empty: it does not)."""
        if not ran_epochs:
            return []
        problems = []
        for schedule in schedules:
            if schedule.epoch in self.judged or schedule.start_iteration > iteration:
                continue
            self.judged.add(schedule.epoch)
            late = {e for e in ran_epochs if e < schedule.epoch}
            if not late:
                self.late_in_a_row = 0
                continue
            self.late_in_a_row += 1
            if late == ran_epochs:
                self.missed.add(schedule.epoch)
                problems.append(f"epoch {schedule.epoch} reached its origins after iteration "
                                f"{schedule.start_iteration} began (they ran epoch {max(late)})")
            else:
                problems.append(f"some origins missed epoch {schedule.epoch} (they ran {sorted(late)})")
        for why in problems:
            logger.warning("%s: publishing it again from a later iteration", why)
        return problems

    def effective(self, schedules: Sequence[Schedule]) -> list[Schedule]:
        return [s for s in schedules if s.epoch not in self.missed]

    def dropped(self, schedules: Sequence[Schedule]) -> list[Schedule]:
        return [s for s in schedules if s.epoch in self.missed]

    def margin_factor(self) -> int:
        return 2 ** min(self.late_in_a_row, MAX_MARGIN_DOUBLINGS)
