"""Turning stage-0 peers' iteration reports into per-iteration swarm summaries."""
from dataclasses import dataclass, field
from typing import Callable

from protocol.messages import IterationReport, ProgressRecord

from tokendata.cursor import compress_positions, expand_positions


@dataclass(frozen=True)
class IterationSummary:
    iteration: int
    epoch: int
    loss: float
    samples: int
    tokens: int
    started_at: float
    finished_at: float
    completed: int
    rerouted: int
    skipped_stage: int
    reissued: int
    lost: int
    stages_visited: int
    lost_microbatches: tuple[int, ...] = ()   # ids, reported lost or planned for a dead origin
    positions: tuple[int, ...] = ()           # sample positions trained, as (start, count) pairs

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at


def summarize(iteration: int, reports: list[IterationReport], unreported_lost: int = 0,
              unreported_ids: tuple[int, ...] = ()) -> IterationSummary:
    """`unreported_lost`: microbatches of origins that died before reporting (lost, and said so);
    `unreported_ids` their ids where the schedule is known."""
    trained = [p for r in reports for p in expand_positions(r.positions)]
    samples = sum(r.samples for r in reports)
    return IterationSummary(
        iteration=iteration, epoch=max(r.epoch for r in reports),
        loss=sum(r.loss_sum for r in reports) / samples if samples else float("nan"),
        samples=samples, tokens=sum(r.tokens for r in reports),
        started_at=min(r.started_at for r in reports), finished_at=max(r.finished_at for r in reports),
        completed=sum(r.counts.completed for r in reports), rerouted=sum(r.counts.rerouted for r in reports),
        skipped_stage=sum(r.counts.skipped_stage for r in reports),
        reissued=sum(r.counts.reissued for r in reports),
        lost=sum(r.counts.lost for r in reports) + unreported_lost,
        stages_visited=sum(r.stages_visited for r in reports),
        lost_microbatches=tuple(sorted({mb for r in reports for mb in r.lost_microbatches} | set(unreported_ids))),
        positions=compress_positions(trained))


@dataclass
class ProgressTracker:
    """Collects reports; an iteration is complete once every expected origin reported it."""

    next_iteration: int = 0
    started: bool = False          # the first report fixes where we start (runs may resume)
    reports: dict[int, dict[str, IterationReport]] = field(default_factory=dict)
    missed: int = 0                # iterations whose reports left every origin's window unread
    # peer -> (newest iteration, written_at, how long after finishing that iteration it wrote the
    # record: a lower bound on how long the next one has run, as records are re-stored every few
    # seconds while it runs)
    written: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def add(self, records: dict[str, ProgressRecord]) -> None:
        for peer, record in records.items():
            if record.reports and record.written_at > 0:
                newest = max(record.reports, key=lambda r: r.iteration)
                self.written[peer] = (newest.iteration, record.written_at,
                                      max(0.0, record.written_at - newest.finished_at))
        oldest = [min(r.iteration for r in rec.reports) for rec in records.values() if rec.reports]
        if self.started and oldest and min(oldest) > self.next_iteration and self.next_iteration not in self.reports:
            # every origin's window has moved past the iterations we wait for (we read too
            # rarely for how fast the swarm trains): they can never complete, go on from there
            self.missed += min(oldest) - self.next_iteration
            self.next_iteration = min(oldest)
        for peer, record in records.items():
            for report in record.reports:
                if report.iteration >= self.next_iteration:
                    self.reports.setdefault(report.iteration, {})[peer] = report

    def complete(self, origins_for: Callable[[int], set[str]],
                 gone: Callable[[str], bool] = lambda peer: False,
                 planned_for: Callable[[int, str], int] = lambda i, peer: 0,
                 planned_ids: Callable[[int, str], list[int]] = lambda i, peer: [],
                 known_from: int = 0) -> list[IterationSummary]:
        """Summaries of newly completed iterations, in order. `origins_for(i)` gives the set of
        stage-0 peers expected to report iteration i; one that is `gone` (left the swarm)
        without reporting counts its `planned_for(i, peer)` microbatches as lost. `known_from`:
        the first iteration a schedule we know covers (a restarted coordinator reads only the
        latest schedule; it cannot account the iterations before it, so it starts after them)."""
        done = []
        if not self.started and self.reports:
            # (re)starting: from the first iteration every reporting origin still has (each
            # keeps a bounded window, so older ones may be gone from some records)
            firsts = {}
            for i in sorted(self.reports):
                for peer in self.reports[i]:
                    firsts.setdefault(peer, i)
            self.next_iteration, self.started = max(max(firsts.values()), known_from), True
            for i in [i for i in self.reports if i < self.next_iteration]:
                del self.reports[i]
        while True:
            got = self.reports.get(self.next_iteration, {})
            expected = origins_for(self.next_iteration)
            missing = expected - set(got)
            if not got or not expected or not all(gone(p) for p in missing):
                break
            lost = sum(planned_for(self.next_iteration, p) for p in missing)
            lost_ids = tuple(mb for p in missing for mb in planned_ids(self.next_iteration, p))
            done.append(summarize(self.next_iteration, [got[p] for p in sorted(expected - missing)], lost,
                                  lost_ids))
            del self.reports[self.next_iteration]
            self.next_iteration += 1
        return done

    def freshest(self) -> tuple[int, float] | None:
        """(newest iteration, written_at) of the most recently stored progress record, if any
        peer dates its records (protocol 1.7)."""
        fresh = self._freshest()
        return None if fresh is None else fresh[:2]

    def running_s(self) -> float:
        """How long the swarm's current iteration has run at least, by the freshest record (0: unknown)."""
        fresh = self._freshest()
        return 0.0 if fresh is None else fresh[2]

    def _freshest(self) -> tuple[int, float, float] | None:
        return max(self.written.values(), key=lambda w: w[1], default=None)

    def newest_epoch(self) -> int | None:
        """The newest epoch any unsummarised report ran under."""
        return max((r.epoch for by_peer in self.reports.values() for r in by_peer.values()), default=None)

    def latest_reported(self) -> int:
        return max(self.reports, default=self.next_iteration - 1)
