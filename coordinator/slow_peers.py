"""Peers demoted by their measured speed (issue 25): pure rules with hysteresis.

A peer whose benchmark said it is fast but that computes far slower (another job on the
machine, throttling, a wrong benchmark) kept its place in the plan and set the pace of every
route through it. Peers advertise the forward speed they measure while training
(`PeerAdvert.measured_fwd_s_per_layer_sample`, peer/pipeline/speed_meter.py); a peer whose
figure stays at `demote_ratio` times the swarm's median for `hold_s` is planned with that
slowdown (the planner then gives it less work or none), and one back within `restore_ratio`
for `hold_s` is planned at its advertised speed again. Ratios to the median, not absolute
figures: a machine-wide slowdown (a loaded host) demotes nobody.

A member can lie in its advert as in its benchmark, so the origins' round trips witness the
speed of the peers on their routes too (coordinator/witnessed_speed.py): a peer's ratio is the
larger of its advertised one and its witnessed one (its time per round trip to the median
peer's). A witnessed figure is kept for `witness_memory_s` after the routes last identified the
peer: demoted, it gets less work or none, and so no new figure; once that figure is forgotten
it is planned as it advertises, and judged again by what it does.
"""
import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from protocol.adverts import PeerAdvert
from protocol.schedule import Schedule

from protocol.topology import Topology

MIN_MEASURED = 3     # fewer peers with a figure: no median worth comparing with


@dataclass(frozen=True)
class SlowPolicy:
    demote_ratio: float = 3.0
    restore_ratio: float = 1.5
    hold_s: float = 6.0
    witness_memory_s: float = 60.0
    # the witnessed figures carry overheads every route shares, which shrink their ratios (a
    # peer computing 10x slower showed 2-4x): they demote at a lower ratio; in the faults
    # bench's undisturbed phases no honest peer went past 1.5x
    witnessed_demote_ratio: float = 2.0
    # demoted, a peer gets less work and so queues less: its witnessed ratio drops although it
    # is as slow as before (10x compute: 2.9 demoted, then 1.4), so it counts as keeping time
    # again only at the median; meanwhile it is planned at the ratio it shows
    witnessed_restore_ratio: float = 1.0
    late_factor: float = 10.0
    late_memory_s: float = 20.0


@dataclass
class SlowPeers:
    policy: SlowPolicy = SlowPolicy()
    factors: dict[str, float] = field(default_factory=dict)     # demoted peer -> its ratio to the median
    planned_with: frozenset[str] = frozenset()                  # the demoted set the current plan used
    _crossing_since: dict[str, float] = field(default_factory=dict)
    witnessed: dict[str, tuple[float, float]] = field(default_factory=dict)   # peer -> (ratio, when)
    late_since: dict[str, float] = field(default_factory=dict)               # peer -> last named late

    def observe(self, measured: dict[str, float], now: float, witnessed: dict[str, float] | None = None,
                late: Iterable[str] = ()) -> None:
        """`measured`: online peers' advertised measured seconds per layer and sample (0: none
        yet); `witnessed`: seconds per round trip of the peers the origins' routes identify;
        `late`: peers a planned neighbour names as late (late_reports)."""
        for peer in [p for p in self.factors if p not in measured]:   # gone: its departure re-plans
            del self.factors[peer]
        for peer, ratio in _ratios_to_median(witnessed or {}).items():
            self.witnessed[peer] = (ratio, now)
        for peer in [p for p, (_, when) in self.witnessed.items()
                     if p not in measured or now - when > self.policy.witness_memory_s]:
            del self.witnessed[peer]
        self._observe_late(measured, now, late)
        advertised = _ratios_to_median(measured)
        for peer in set(advertised) | set(self.witnessed) | set(self.factors):
            if peer in self.late_since:
                continue
            said, seen = advertised.get(peer, 0.0), self.witnessed.get(peer, (0.0, 0.0))[0]
            ratio = max(said, seen)
            demoted = peer in self.factors
            if demoted:
                crossing = said <= self.policy.restore_ratio and seen <= self.policy.witnessed_restore_ratio
            else:
                crossing = said >= self.policy.demote_ratio or seen >= self.policy.witnessed_demote_ratio
            if not crossing:
                self._crossing_since.pop(peer, None)
                if demoted:
                    self.factors[peer] = ratio
                continue
            since = self._crossing_since.setdefault(peer, now)
            if now - since < self.policy.hold_s:
                continue
            del self._crossing_since[peer]
            if demoted:
                del self.factors[peer]
            else:
                self.factors[peer] = ratio

    def _observe_late(self, measured: dict[str, float], now: float, late: Iterable[str]) -> None:
        for peer in late:
            if peer in measured:
                self.late_since[peer] = now
                self.factors[peer] = max(self.factors.get(peer, 1.0), self.policy.late_factor)
                self._crossing_since.pop(peer, None)
        for peer in [p for p, when in self.late_since.items() if p not in measured or now - when > self.policy.late_memory_s]:
            del self.late_since[peer]

    def pending(self) -> bool:
        """The demoted set differs from what the current plan used: a re-plan is due."""
        return frozenset(self.factors) != self.planned_with

    def apply(self, topology: Topology) -> Topology:
        """The topology as the next plan should see it; remembers what it was planned with."""
        self.planned_with = frozenset(self.factors)
        if not self.factors:
            return topology
        nodes = tuple(dataclasses.replace(n, slowdown=n.slowdown * self.factors[n.id]) if n.id in self.factors
                      else n for n in topology.nodes)
        return dataclasses.replace(topology, nodes=nodes)

    def describe(self) -> str:
        """The demoted peers and their ratios; one the origins witnessed is marked (witnessed)."""
        def seen(peer: str, ratio: float) -> str:
            if peer in self.late_since:
                return " (late)"
            return " (witnessed)" if self.witnessed.get(peer, (0.0, 0.0))[0] >= ratio else ""
        return ", ".join(f"{p[:8]} x{r:.1f}{seen(p, r)}" for p, r in sorted(self.factors.items())) or "none"


def _ratios_to_median(seconds: dict[str, float]) -> dict[str, float]:
    """Each figure over the median of the known (> 0) ones; none with fewer than MIN_MEASURED."""
    known = {p: s for p, s in seconds.items() if s > 0}
    if len(known) < MIN_MEASURED:
        return {}
    median = statistics.median(known.values())
    return {p: s / median for p, s in known.items()}


def late_reports(adverts: Mapping[str, PeerAdvert], schedule: Schedule | None) -> set[str]:
    """Peers named late by a member of `schedule` that hands them work: both planned, on
    different stages (replicas of a stage never hand each other a microbatch). A member can
    still name a neighbour falsely; that costs the neighbour work for a while, not its place."""
    if schedule is None:
        return set()
    stage_of = schedule.stage_of()
    return {accused for reporter, advert in adverts.items() if reporter in stage_of
            for accused in advert.late_peers
            if accused in stage_of and accused != reporter and stage_of[accused] != stage_of[reporter]}
