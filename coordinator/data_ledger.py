"""The coordinator's side of the global sample cursor (tokendata/cursor.py).

Positions follow from the schedules alone; what only the coordinator learns is which
microbatches were lost. It keeps their positions and hands them to the next epoch it
publishes (`data_retry`), so that within a data epoch no sample is trained twice or skipped.
An epoch republished only to carry retries keeps its routes.
"""
from protocol.schedule import Schedule

from tokendata.cursor import microbatch_positions, schedule_cursor


class DataLedger:
    def __init__(self, microbatch_samples: int):
        self.microbatch_samples = microbatch_samples
        self.pending: list[int] = []        # lost positions no published schedule carries yet
        self.lost_total = 0                 # samples lost so far (all later retried)
        self.lost_positions: set[int] = set()   # every position ever lost (owed until trained)
        self.resumed: tuple[int, tuple[int, ...]] | None = None   # (base, retry) from a checkpoint

    def lost(self, schedule: Schedule | None, iteration: int, microbatch_ids) -> list[int]:
        """Note the lost microbatches of `iteration`, trained under `schedule`."""
        if schedule is None:
            return []
        known = {r.microbatch_id for r in schedule.routes}
        positions = [p for mb in sorted(set(microbatch_ids)) if mb in known
                     for p in microbatch_positions(schedule, self.microbatch_samples, iteration, mb)]
        fresh = [p for p in positions if p not in self.pending]
        self.pending.extend(fresh)
        self.lost_total += len(fresh)
        self.lost_positions.update(positions)
        return fresh

    def fields_for(self, previous: Schedule | None, start_iteration: int) -> dict:
        """`data_base` and `data_retry` of a schedule taking over at `start_iteration`."""
        if previous is None:
            base, left = self.resumed or (0, ())
        else:
            base, left = schedule_cursor(previous, self.microbatch_samples).at(start_iteration)
        retry = list(left) + [p for p in self.pending if p not in left]
        self.pending = []
        return {"data_base": base, "data_retry": tuple(retry)}

    def has_pending(self) -> bool:
        return bool(self.pending)
