"""Every schedule this coordinator published (or followed), and which one each iteration ran
under: what the progress accounting, the data cursor and the spot-check rules read."""
from typing import Callable

from protocol.schedule import Route, Schedule
from swarmcore.schedule_history import schedule_for_iteration

from coordinator.data_ledger import DataLedger
from coordinator.epoch_uptake import EpochUptake


class PublishedSchedules:
    def __init__(self, reports_of: Callable[[int], dict]):
        self.reports_of = reports_of        # iteration -> {origin: IterationReport} not yet summarised
        self.all: list[Schedule] = []       # oldest first
        self.uptake = EpochUptake()         # which of them reached the origins in time

    def add(self, schedule: Schedule) -> None:
        self.all.append(schedule)

    def by_epoch(self, epoch: int) -> Schedule | None:
        return next((s for s in reversed(self.all) if s.epoch == epoch), None)

    def known_from(self) -> int:
        return min((s.start_iteration for s in self.all), default=0)

    def ran_under(self, iteration: int, reports: dict | None = None) -> Schedule | None:
        """The schedule `iteration` ran under: the epoch its origins reported, when they agree (an
        epoch they read too late never took effect for them: epoch_uptake.py), else the one
        covering it among those that took effect."""
        epochs = {r.epoch for r in (self.reports_of(iteration) if reports is None else reports).values()}
        if len(epochs) == 1:
            ran = self.by_epoch(min(epochs))
            if ran is not None and ran.start_iteration <= iteration:
                return ran
        return schedule_for_iteration(self.uptake.effective(self.all), iteration)

    def judge(self, iteration: int, reports: dict) -> list[str]:
        return self.uptake.judge(self.all, iteration, {r.epoch for r in reports.values()})

    def awaits_uptake(self, start: int) -> bool:
        """Whether an epoch that would run until `start` has not been judged yet: a schedule
        from `start` published now would go on from a data cursor its origins may never run."""
        return any(s.epoch not in self.uptake.judged and s.start_iteration <= start for s in self.all)

    def data_fields(self, ledger: DataLedger, start: int) -> dict:
        return ledger.fields_for(self.uptake.effective(self.all), start, self.uptake.dropped(self.all))

    def route_of(self, epoch: int, microbatch_id: int) -> Route | None:
        """The route a published schedule gave (epoch, microbatch): spot-check reports are
        accepted only from that route's receivers."""
        schedule = self.by_epoch(epoch)
        return None if schedule is None else next((r for r in schedule.routes if r.microbatch_id == microbatch_id), None)

    def replicas_of(self, epoch: int, stage: int) -> set[str]:
        """The peers a published schedule put on `stage` in `epoch`: only they take each other's shares."""
        schedule = self.by_epoch(epoch)
        return set() if schedule is None else {a.peer for a in schedule.assignment if a.stage == stage}

    def origins_for(self, iteration: int) -> set[str]:
        schedule = self.ran_under(iteration)
        return set() if schedule is None else {r.origin for r in schedule.routes}

    def planned_ids(self, iteration: int, origin: str) -> list[int]:
        schedule = self.ran_under(iteration)
        return [] if schedule is None else [r.microbatch_id for r in schedule.routes if r.origin == origin]

    def planned_microbatches(self, iteration: int, origin: str) -> int:
        return len(self.planned_ids(iteration, origin))
