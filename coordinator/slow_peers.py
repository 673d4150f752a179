"""Peers demoted by their measured speed (issue 25): pure rules with hysteresis.

A peer whose benchmark said it is fast but that computes far slower (another job on the
machine, throttling, a wrong benchmark) kept its place in the plan and set the pace of every
route through it. Peers advertise the forward speed they measure while training
(`PeerAdvert.measured_fwd_s_per_layer_sample`, peer/pipeline/speed_meter.py); a peer whose
figure stays at `demote_ratio` times the swarm's median for `hold_s` is planned with that
slowdown (the planner then gives it less work or none), and one back within `restore_ratio`
for `hold_s` is planned at its advertised speed again. Ratios to the median, not absolute
figures: a machine-wide slowdown (a loaded host) demotes nobody.

A member could lie here as in its benchmark; what this catches is a peer slower than it
claims, which hurts every route it is on, not one claiming to be slow (that only costs it work).
"""
import dataclasses
import statistics
from dataclasses import dataclass, field

from protocol.topology import Topology

MIN_MEASURED = 3     # fewer peers with a figure: no median worth comparing with


@dataclass(frozen=True)
class SlowPolicy:
    demote_ratio: float = 3.0
    restore_ratio: float = 1.5
    hold_s: float = 6.0


@dataclass
class SlowPeers:
    policy: SlowPolicy = SlowPolicy()
    factors: dict[str, float] = field(default_factory=dict)     # demoted peer -> its ratio to the median
    planned_with: frozenset[str] = frozenset()                  # the demoted set the current plan used
    _crossing_since: dict[str, float] = field(default_factory=dict)

    def observe(self, measured: dict[str, float], now: float) -> None:
        """`measured`: online peers' measured seconds per layer and sample (0: none yet)."""
        for peer in [p for p in self.factors if p not in measured]:   # gone: its departure re-plans
            del self.factors[peer]
        known = {p: s for p, s in measured.items() if s > 0}
        if len(known) < MIN_MEASURED:
            return
        median = statistics.median(known.values())
        for peer, seconds in known.items():
            ratio = seconds / median
            demoted = peer in self.factors
            crossing = ratio <= self.policy.restore_ratio if demoted else ratio >= self.policy.demote_ratio
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
        return ", ".join(f"{p[:8]} x{r:.1f}" for p, r in sorted(self.factors.items())) or "none"
