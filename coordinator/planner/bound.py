"""A lower bound on the iteration period of a schedule's partition, so the planner (and whoever
reads `plan` / `simulate`) can tell how much a schedule loses to contention and ordering.

The relaxation keeps the partition (which nodes host which stage), each origin's microbatches
and the path length L, and drops everything that makes scheduling hard:
- any microbatch may visit the L - 1 stages that are cheapest for it, each on its cheapest
  replica, entered over that replica's cheapest link from a node of another stage (activation
  there, gradient back), and returns to its origin over the origin's cheapest such link; no
  task or transfer ever waits;
- so one microbatch of origin o takes at least path(o) = its stage-0 forward + head + backward
  on o, plus those L - 1 cheapest (compute + entering round trip) terms, plus o's cheapest
  incoming round trip;
- o holds each of its microbatches from its forward to its backward, `memory` at a time, so
  its M microbatches take at least ceil(M / memory) x path(o); and o computes all of its own
  stage-0 work alone: M x (forward + head + backward);
- the other nodes share all microbatches' non-stage-0 compute at best evenly: total / count.
The bound is the largest of these; the gradient exchange and the boundary are left out.
"""
import math

from coordinator.planner.costs import CostModel
from protocol.schedule import Schedule
from protocol.topology import Topology


def _cheapest_entry(cost: CostModel, node: int, stage_at: dict[int, int]) -> float:
    """The cheapest round trip into `node` from a node of another stage (a hop never stays
    within a stage)."""
    trips = [cost.round_trip_list[u][node] for u, s in stage_at.items() if s != stage_at[node]]
    return min(trips, default=0.0)


def lower_bound(schedule: Schedule, topology: Topology, cost: CostModel | None = None) -> float:
    """Seconds: no schedule of this partition, microbatches and path length runs an iteration
    faster (see the module docstring). 0.0 for a schedule without routes."""
    cost = cost or CostModel(topology)
    if not schedule.routes:
        return 0.0
    stage_of = {p: s for p, s in schedule.stage_of().items() if p in cost.index}
    stage_at = {cost.index[p]: s for p, s in stage_of.items()}
    replicas: dict[int, list[int]] = {}
    for p, s in stage_of.items():
        replicas.setdefault(s, []).append(cost.index[p])
    # per non-zero stage: the cheapest replica's compute plus its cheapest way in
    visit = sorted(min(cost.fwd_list[r][s] + cost.bwd_list[r][s] + _cheapest_entry(cost, r, stage_at) for r in rs)
                   for s, rs in replicas.items() if s != 0)
    work = sorted(min(cost.fwd_list[r][s] + cost.bwd_list[r][s] for r in rs) for s, rs in replicas.items() if s != 0)
    extra = max(len(r.hops) for r in schedule.routes) - 1
    per_origin: dict[str, int] = {}
    for route in schedule.routes:
        per_origin[route.origin] = per_origin.get(route.origin, 0) + 1
    bound = 0.0
    for origin, count in per_origin.items():
        o = cost.index[origin]
        own = cost.fwd_list[o][0] + cost.bwd_list[o][0] + cost.head_list[o]
        path = own + sum(visit[:extra]) + (_cheapest_entry(cost, o, stage_at) if extra else 0.0)
        bound = max(bound, count * own, math.ceil(count / max(1, cost.memory[o])) * path)
    others = sum(1 for s in stage_of.values() if s != 0)
    if others and extra:
        bound = max(bound, len(schedule.routes) * sum(work[:extra]) / others)
    return bound
