"""An immutable snapshot of the swarm (adverts + link measurements) and its translation into
the planner's Topology, with peer ids as node ids."""
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from coordinator.advert_check import ModelFacts, advert_problem
from coordinator.planner.relayed import penalise_relayed, relayed_ids

from protocol.adverts import LinkReport, PeerAdvert, PeerState
from protocol.messages import RunSpec
from protocol.schedule import Route
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload
from swarmcore.schedule_history import backward_check_receivers, spot_check_receivers

DEFAULT_LATENCY_MS = 1.0        # for pairs nobody has measured yet
DEFAULT_BANDWIDTH_GIB_S = 1.0
MIN_FWD_S = 1e-6


class NotPlannable(Exception):
    """The swarm cannot be planned yet (the message says why)."""


class BanList:
    """Peers that failed spot checks, kept out of planning for the rest of the run.

    A peer is banned after `failures_to_ban` failed checks reported by at least
    `reporters_to_ban` distinct members, so one lying reporter cannot ban an honest peer alone
    (set reporters_to_ban=1 for swarms with a single replica per stage to check).

    With `routes` ((epoch, microbatch_id) -> the Route a published schedule gave it, or None), a
    report counts only from the peer that received the checked hop's output on that route: a
    member cannot file failures about peers it never received anything from (issue 24); a
    "backward" report (the suspect's input gradient) only from the receiver of that backward. A
    "share" report (a replica's gradient share left out repeatedly, peer/pipeline/robust_shares)
    counts only when `replicas` ((epoch, stage) -> the peers a published schedule put on that
    stage) has both the reporter and the suspect on the reported stage: only a replica receives
    another's shares."""

    SEEN_KEPT = 16384                          # > 64 reports x many reporters: a report counts once

    def __init__(self, failures_to_ban: int = 2, reporters_to_ban: int = 2,
                 routes: Callable[[int, int], Route | None] | None = None,
                 replicas: Callable[[int, int], set[str]] | None = None):
        self.failures_to_ban, self.reporters_to_ban = failures_to_ban, reporters_to_ban
        self.routes, self.replicas = routes, replicas
        self.ignored_reports = 0                   # reports from peers not placed to make them
        self._failures: dict[str, set[tuple]] = {}
        self.banned: dict[str, str] = {}       # peer id -> reason, for the status page
        self.counts = {"passed": 0, "failed": 0}   # distinct members' reports seen (status, summary)
        self._seen: dict[tuple, None] = {}

    def observe(self, reporter: str, reports) -> list[str]:
        """Add one member's reports; returns peers banned just now. Self-reports are ignored."""
        newly = []
        for r in reports:
            if r.checker != reporter or r.suspect == reporter or not self._placed_to_report(reporter, r):
                continue
            self._count(reporter, r)
            if r.passed or r.suspect in self.banned:
                continue
            seen = self._failures.setdefault(r.suspect, set())
            seen.add((reporter, r.epoch, r.iteration, r.microbatch_id, r.kind))
            reporters = {x[0] for x in seen}
            if len(seen) >= self.failures_to_ban and len(reporters) >= self.reporters_to_ban:
                what = {"share": "spot checks or share checks", "backward": "spot checks (backward)"}.get(
                    r.kind, "spot checks")
                self.banned[r.suspect] = (f"failed {len(seen)} {what} (from {len(reporters)} peers; "
                                          f"last relative error {r.relative_error:.3g})")
                newly.append(r.suspect)
        return newly

    def _placed_to_report(self, reporter: str, r) -> bool:
        if getattr(r, "kind", "forward") == "share":
            if self.replicas is None:
                return self.routes is None
            placed = self.replicas(r.epoch, r.stage)
            if reporter in placed and r.suspect in placed:
                return True
            self.ignored_reports += 1
            return False
        if self.routes is None:
            return True
        route = self.routes(r.epoch, r.microbatch_id)
        receivers = backward_check_receivers if r.kind == "backward" else spot_check_receivers
        if route is not None and reporter in receivers(route, r.suspect, r.stage):
            return True
        self.ignored_reports += 1
        return False

    def _count(self, reporter: str, r) -> None:
        key = (reporter, r.suspect, r.epoch, r.iteration, r.microbatch_id, r.stage, r.kind)
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > self.SEEN_KEPT:
            del self._seen[next(iter(self._seen))]
        self.counts["passed" if r.passed else "failed"] += 1


@dataclass(frozen=True)
class SwarmSnapshot:
    adverts: dict[str, PeerAdvert]
    links: dict[str, LinkReport]

    @property
    def online(self) -> dict[str, PeerAdvert]:
        return {p: a for p, a in self.adverts.items() if a.state == PeerState.ONLINE}

    def link(self, src: str, dst: str) -> tuple[float, float] | None:
        """(rtt_ms, bandwidth_bytes_s) measured from src to dst, or the reverse direction."""
        for a, b in ((src, dst), (dst, src)):
            report = self.links.get(a)
            if report is not None:
                for m in report.links:
                    if m.peer_id == b:
                        return m.rtt_ms, m.bandwidth_bytes_s
        return None


def plannable(online: dict[str, PeerAdvert], spec: RunSpec) -> list[str]:
    """The online peers whose adverts fit the spec, sorted; where the coordinator does not know
    the model, those that agree with the most common layer count."""
    facts = ModelFacts.of(spec)
    peers = sorted(p for p, a in online.items() if advert_problem(a, spec, facts) is None)
    if facts is None and peers:
        layers, _ = Counter(online[p].num_layers for p in peers).most_common(1)[0]
        peers = [p for p in peers if online[p].num_layers == layers]
    return peers


def to_topology(snapshot: SwarmSnapshot, spec: RunSpec, pinned: dict[str, int]) -> Topology:
    """Topology of the ONLINE peers. `pinned`: stages peers already host (kept on re-plans,
    so that no peer throws away its trained parameters). An advert the run spec rules out
    (coordinator/advert_check.py) is left out: one peer's claims never stop the planning."""
    peers = plannable(snapshot.online, spec)
    if not peers:
        raise NotPlannable("no peer is online" if not snapshot.online else "no online peer has a plausible advert")
    adverts = [snapshot.online[p] for p in peers]
    workload = Workload(
        num_layers=adverts[0].num_layers, num_stages=spec.num_stages, microbatch_samples=spec.microbatch_samples,
        microbatches_per_data_node=spec.microbatches_per_origin,
        activation_bytes_per_sample=max(a.activation_bytes_per_sample for a in adverts),
        memory_microbatches=max(1, min(a.memory_microbatches for a in adverts)),
        stage_sizes=spec.stage_sizes, param_bytes_per_layer=max(a.param_bytes_per_layer for a in adverts),
        stage0_extra_param_bytes=max(a.stage0_extra_param_bytes for a in adverts), global_batch=spec.global_batch,
        delayed_exchange=spec.gradient_exchange == "delayed")
    nodes = tuple(Node(id=p, fwd_s_per_layer_sample=max(a.fwd_s_per_layer_sample, MIN_FWD_S),
                       location=a.public_name, memory_microbatches=a.memory_microbatches,
                       stage=pinned.get(p, a.stage if 0 <= a.stage < spec.num_stages else -1))
                  for p, a in zip(peers, adverts))
    latency, bandwidth = [], []
    for src in peers:
        lat_row, bw_row = [], []
        for dst in peers:
            measured = None if src == dst else snapshot.link(src, dst)
            lat_row.append(0.0 if src == dst else (measured[0] / 2 if measured else DEFAULT_LATENCY_MS))
            bw_row.append(0.0 if src == dst else (measured[1] / 2**30 if measured else DEFAULT_BANDWIDTH_GIB_S))
        latency.append(tuple(lat_row))
        bandwidth.append(tuple(bw_row))
    topology = Topology(TOPOLOGY_FORMAT, workload, nodes, Links(tuple(latency), tuple(bandwidth)))
    # Relayed peers' links are planned dearer than measured (why: coordinator/planner/relayed.py).
    relayed = relayed_ids({p: a.reachability for p, a in zip(peers, adverts)},
                          {p: a.maddrs for p, a in zip(peers, adverts)})
    return penalise_relayed(topology, relayed)
