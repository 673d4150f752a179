"""The coordinator's side of the global sample cursor (tokendata/cursor.py).

Positions follow from the schedules alone; what only the coordinator learns is which
microbatches were lost. It keeps their positions and hands them to the next epoch it
publishes (`data_retry`), so that within a data epoch no sample is trained twice or skipped.
An epoch republished only to carry retries keeps its routes.
"""
from typing import Sequence

from protocol.schedule import Schedule
from swarmcore.schedule_history import schedule_for_iteration

from tokendata.cursor import microbatch_positions, schedule_cursor


class DataLedger:
    def __init__(self, microbatch_samples: int):
        self.microbatch_samples = microbatch_samples
        self.pending: list[int] = []        # lost positions no published schedule carries yet
        self.lost_total = 0                 # samples lost so far (all later retried)
        self.lost_positions: set[int] = set()   # every position ever lost (owed until trained)
        self.resumed: tuple[int, tuple[int, ...]] | None = None   # (base, retry) from a checkpoint
        # position -> the latest start of a known schedule that hands it out again: a loss before
        # that start is already owed (a restarted coordinator accounts iterations its
        # predecessor did, and must not owe their losses twice)
        self.carried: dict[int, int] = {}

    def carried_by(self, schedule: Schedule) -> None:
        for p in schedule.data_retry:
            self.carried[p] = max(self.carried.get(p, -1), schedule.start_iteration)

    def lost(self, schedule: Schedule | None, iteration: int, microbatch_ids) -> list[int]:
        """Note the lost microbatches of `iteration`, trained under `schedule`."""
        if schedule is None:
            return []
        known = {r.microbatch_id for r in schedule.routes}
        positions = [p for mb in sorted(set(microbatch_ids)) if mb in known
                     for p in microbatch_positions(schedule, self.microbatch_samples, iteration, mb)]
        fresh = [p for p in positions if p not in self.pending and self.carried.get(p, -1) <= iteration]
        self.pending.extend(fresh)
        self.lost_total += len(fresh)
        self.lost_positions.update(positions)
        return fresh

    def fields_for(self, published: Sequence[Schedule], start_iteration: int,
                   missed: Sequence[Schedule] = ()) -> dict:
        """`data_base` and `data_retry` of a schedule taking over at `start_iteration`, after the
        schedules `published` so far (oldest first). The cursor goes on from the one that covers
        `start_iteration`; one published to start later never takes effect, so the retries it
        carried move over (a re-plan can start before a republish that only carried retries).
        So do those of `missed` epochs (coordinator/epoch_uptake.py), less the retries of every
        epoch that took effect by `start_iteration`: the origins ran those epochs instead, and
        they handed them out (a missed re-plan may have taken them over from one that then ran)."""
        covering = schedule_for_iteration(published, start_iteration)
        if covering is None:
            base, left = self.resumed or (0, ())
        else:
            base, left = schedule_cursor(covering, self.microbatch_samples).at(start_iteration)
        # published after the covering one (which already carries what those before it held)
        after = covering.epoch if covering is not None else -1
        superseded = [p for s in published if s.epoch > after and s.start_iteration > start_iteration
                      for p in s.data_retry]
        # a missed epoch's retries, less what an epoch that took effect by now handed out (the
        # covering one, or one the missed epoch had taken them over from): only once
        handed_out = {p for s in published if s.start_iteration <= start_iteration for p in s.data_retry}
        carried = [p for s in missed for p in s.data_retry if p not in handed_out]
        retry = list(dict.fromkeys([*left, *superseded, *carried, *self.pending]))
        self.pending = []
        return {"data_base": base, "data_retry": tuple(retry)}

    def has_pending(self) -> bool:
        return bool(self.pending)
