"""Peers' speed as the origins witness it (issue 25), which a peer cannot fake in its advert.

Each origin reports, for every microbatch that completed on its planned route, the seconds from
sending its first forward to its gradient's return (`IterationReport.round_trip_s`). That is
what each peer on the route took (its forward and backward, its queue, the link into it) plus
what the origin did meanwhile (its head work, its queue), fitted as

    round_trip = sum(time(peer) for the route's peers other than its origin)

so a peer's figure carries its share of the origins' part too. Not an offset per origin: with
3 stages and a skip ratio of 1/3 every route visits exactly one other peer, and an offset
would leave no peer identified (bench/faults.py). The overheads every route shares make the
figures' ratios smaller than the compute's: a peer is demoted for what it adds to round trips,
which is what slows the swarm. SkipPipe's skips send microbatches through different subsets of
peers, so a least squares fit over the recent round trips tells the peers apart. A peer is
judged only where the routes identify it: two peers that always appear together (every route
through one goes through the other) cannot be told apart, and neither gets a figure.

An origin could lie here too, to have an honest peer demoted; demotion only costs that peer
work, and a planner preference is all that rests on it.
"""
import collections
from dataclasses import dataclass, field

import numpy as np

from protocol.messages import IterationReport
from protocol.schedule import Schedule

IDENTIFIED = 1e-6       # how close a peer's row of the fit's projection must be to a unit vector


@dataclass
class WitnessedSpeed:
    window: int = 48           # round trips kept (all origins together): ~6 iterations of 8 microbatches,
    #                            so that a peer that slowed down shows within a few iterations
    min_samples: int = 4       # a peer on fewer of them gets no figure
    samples: collections.deque = field(default_factory=collections.deque)  # (origin, peers, seconds)
    _fitted: dict[str, float] | None = None   # times() of the current samples (the coordinator asks every round)

    def add(self, schedule: Schedule | None, reports: dict[str, IterationReport]) -> None:
        """One summarised iteration's reports, under the schedule it ran under. Not one with a
        microbatch rerouted, reissued or lost: a fault reshapes the loads, and the replica that
        took a dead one's work would look slow (bench/faults.py, a stopped replica)."""
        if schedule is None or any(_disturbed(r) for r in reports.values()):
            return
        routes = {r.microbatch_id: r for r in schedule.routes}
        for origin, report in reports.items():
            for mb, seconds in zip(report.timed_microbatches, report.round_trip_s):
                route = routes.get(mb)
                if route is None or route.origin != origin:
                    continue   # not this origin's microbatch in that epoch: a report to ignore
                self.samples.append((origin, tuple(sorted({h.peer for h in route.hops} - {origin})), seconds))
                self._fitted = None
        while len(self.samples) > self.window:
            self.samples.popleft()

    def times(self) -> dict[str, float]:
        """Seconds each identified peer adds to a round trip (its forward, backward, queue and
        incoming link), fitted over the window."""
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> dict[str, float]:
        counts = collections.Counter(p for _, peers, _ in self.samples for p in peers)
        peers = sorted(p for p, n in counts.items() if n >= self.min_samples)
        column = {name: k for k, name in enumerate(peers)}
        rows = [(ps, s) for _, ps, s in self.samples if ps and all(p in column for p in ps)]
        if not peers or len(rows) < len(column):
            return {}
        a = np.zeros((len(rows), len(column)))
        b = np.array([s for _, s in rows])
        for r, (route_peers, _) in enumerate(rows):
            for p in route_peers:
                a[r, column[p]] = 1.0
        inverse = np.linalg.pinv(a)           # one decomposition for both: the least squares fit,
        solution = inverse @ b
        projection = inverse @ a              # and row k is a unit vector iff unknown k is determined
        found = {}
        for p in peers:
            k = column[p]
            unit = np.zeros(len(column))
            unit[k] = 1.0
            if np.abs(projection[k] - unit).max() < IDENTIFIED:
                found[p] = max(0.0, float(solution[k]))
        return found


def _disturbed(report: IterationReport) -> bool:
    c = report.counts
    return bool(c.rerouted or c.skipped_stage or c.reissued or c.lost)
