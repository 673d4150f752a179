"""A lower bound on the iteration period of a schedule's partition, so the planner (and whoever
reads `plan` / `simulate`) can tell how much a schedule loses to contention and ordering.

The relaxation keeps the partition (which nodes host which stage), each origin's microbatches
and the path length L, and drops everything that makes scheduling hard:
- any microbatch may visit any L - 1 distinct non-zero stages, in any order, on any of their
  replicas, and no task or transfer ever waits: one microbatch of origin o takes at least
  path(o), the shortest such route (links both ways, forward and backward compute, o's own
  stage-0 forward + head + backward), found exactly by a shortest path over (stages visited,
  node);
- o holds each of its microbatches from its forward to its backward, `memory` at a time, and
  starts them one stage-0 forward after another: with microbatches numbered by start time,
  s_j >= s_{j-1} + forward0 and s_j >= s_{j-memory} + path(o) (when j starts, at most memory - 1
  of the first j are still held, so one numbered j - memory or later has ended), and the
  iteration lasts at least s_{M-1} + path(o); the same holds backwards in time with o's
  stage-0 backwards, which end one after another (`lanes_bound`). And o computes all of its own
  stage-0 work alone: M x (forward + head + backward);
- the other nodes share all microbatches' non-stage-0 compute at best evenly: total / count.
The bound is the largest of these; the gradient exchange and the boundary are left out.
"""
import numpy as np

from coordinator.planner.costs import CostModel, schedule_codecs
from protocol.schedule import Schedule
from protocol.topology import Topology


def cheapest_route(cost: CostModel, origin: int, stage_nodes: dict[int, list[int]], extra: int) -> float:
    """The fastest one microbatch of `origin` can go out through `extra` distinct non-zero
    stages and back, with nothing waiting: a shortest path over (stages visited, node), in
    any stage order (the path rules only remove orders, so this stays a lower bound)."""
    rt = np.asarray(cost.round_trip)
    own = cost.fwd_list[origin][0] + cost.bwd_list[origin][0] + cost.head_list[origin]
    if extra == 0:
        return own
    stages = sorted(s for s in stage_nodes if s != 0)
    work = {s: np.array([cost.fwd_list[k][s] + cost.bwd_list[k][s] for k in stage_nodes[s]]) for s in stages}
    # frontier: frozenset of visited stages -> {last stage: cost vector over its nodes}
    frontier = {frozenset([s]): {s: rt[origin, stage_nodes[s]] + work[s]} for s in stages}
    for _ in range(extra - 1):
        grown: dict[frozenset, dict[int, np.ndarray]] = {}
        for visited, ends in frontier.items():
            for t in stages:
                if t in visited:
                    continue
                ks = stage_nodes[t]
                arrive = np.min([(c[:, None] + rt[np.ix_(stage_nodes[s], ks)]).min(axis=0) for s, c in ends.items()],
                                axis=0) + work[t]
                slot = grown.setdefault(visited | {t}, {})
                slot[t] = np.minimum(slot[t], arrive) if t in slot else arrive
        frontier = grown
    back = min(float((c + rt[stage_nodes[s], origin]).min()) for ends in frontier.values() for s, c in ends.items())
    return own + back


def lanes_bound(count: int, memory: int, path: float, serial: float) -> float:
    """The least time `count` microbatches of one origin take when each lasts `path`, at most
    `memory` are held at once, and consecutive ones start at least `serial` apart (see the
    module docstring)."""
    memory = max(1, memory)
    starts: list[float] = []
    for j in range(count):
        starts.append(max(starts[j - 1] + serial if j else 0.0, starts[j - memory] + path if j >= memory else 0.0))
    return starts[-1] + path if starts else 0.0


def lower_bound(schedule: Schedule, topology: Topology, cost: CostModel | None = None) -> float:
    """Seconds: no schedule of this partition, microbatches and path length runs an iteration
    faster (see the module docstring). 0.0 for a schedule without routes."""
    cost = cost or CostModel(topology, wire=schedule_codecs(schedule))
    if not schedule.routes:
        return 0.0
    stage_of = {p: s for p, s in schedule.stage_of().items() if p in cost.index}
    stage_nodes: dict[int, list[int]] = {}
    for p, s in stage_of.items():
        stage_nodes.setdefault(s, []).append(cost.index[p])
    extra = min(max(len(r.hops) for r in schedule.routes) - 1, sum(1 for s in stage_nodes if s != 0))
    per_origin: dict[str, int] = {}
    for route in schedule.routes:
        per_origin[route.origin] = per_origin.get(route.origin, 0) + 1
    bound = 0.0
    for origin, count in per_origin.items():
        o = cost.index[origin]
        own = cost.fwd_list[o][0] + cost.bwd_list[o][0] + cost.head_list[o]
        path = cheapest_route(cost, o, stage_nodes, extra)
        serial = max(cost.fwd_list[o][0], cost.bwd_list[o][0])    # forwards start, backwards end, in series
        bound = max(bound, count * own, lanes_bound(count, cost.memory[o], path, serial))
    work = sorted(min(cost.fwd_list[r][s] + cost.bwd_list[r][s] for r in rs) for s, rs in stage_nodes.items() if s != 0)
    others = sum(1 for s in stage_of.values() if s != 0)
    if others and extra:
        bound = max(bound, len(schedule.routes) * sum(work[:extra]) / others)
    return bound
