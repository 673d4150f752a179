"""Predicted iteration time of a schedule in a running swarm: the simulated iteration plus
its boundary, in steady state.

simulate() plays one iteration on idle nodes. In the swarm (peer/pipeline/worker.py) an
iteration also has a boundary, and the next iteration starts while parts of it still run:
- an origin (stage-0 peer) is done when its last microbatch's backward ends; it then sends
  IterationDone to every peer; another peer is done once it has all origins' notices;
- every done peer sends its gradients to the other replicas of its stage and waits for their
  shares (CostModel.share / averaging; not for the acks of its own), then steps the optimizer
  (CostModel.step); with delayed updates (Workload.delayed_exchange) it waits instead for the
  shares of the iteration before, sent one boundary earlier (Boundary.arrival_s carried into
  the next round), so the exchange delays it only where it outlasts an iteration;
- before the next iteration each peer finishes its schedule read (started when its work
  ended; an origin's progress report goes out in the background), Overheads.origin_gap_s and
  peer_gap_s; then it starts: an origin its forwards, another peer
  the work that has come in meanwhile. So a peer that ends its boundary late (far replicas,
  a far origin's notice) delays the next iteration's microbatches that reach it early.
One iteration as measured (coordinator/iteration_summaries.py) runs from the first origin's start to the
last origin's end (a span); the period is the time from one iteration's first start to the
next one's, which is what bounds throughput (coordinator/planner/bound.py bounds it below). predict() replays iterations, each starting every node when its previous
one let it go, until the start offsets repeat; a topology without replicas has no exchange cost.
"""
from dataclasses import dataclass

from coordinator.planner.costs import CostModel, schedule_codecs
from coordinator.planner.simulate import SimResult, simulate
from protocol.schedule import Schedule
from protocol.topology import Topology

ROUNDS = 6              # iterations replayed at most (the first one starts on idle nodes)
SETTLED_S = 1e-4        # start offsets that move less than this have settled


@dataclass(frozen=True)
class Boundary:
    done_s: dict[str, float]       # end of the node's work, incl. (non-origins) all IterationDone notices
    exchanged_s: dict[str, float]  # every other replica's gradients received
    end_s: dict[str, float]        # after the optimizer step
    arrival_s: dict[str, float] | None = None   # delayed updates: this iteration's shares all in


@dataclass(frozen=True)
class Prediction:
    iteration_s: float             # first origin's start to last origin's end, in the last round
    cold_s: float                  # the same for one iteration on idle nodes
    rounds: int
    start_s: dict[str, float]      # per node, when the last round let it start
    boundary: Boundary
    sim: SimResult                 # the last round
    memory_overflows: int = 0      # the most forwards over a node's memory in any round
    period_s: float = 0.0          # first origin's start to the next iteration's first start (steady)


def boundary(schedule: Schedule, sim: SimResult, cost: CostModel, start: dict[str, float],
             earlier: dict[str, float] | None = None) -> Boundary:
    """Times (on the iteration's clock) each node of `schedule` ends the iteration's phases.
    `earlier` (delayed updates): when the previous iteration's shares were all in, on this
    iteration's clock (none: the first iteration, nothing pending)."""
    stage_of, lat = schedule.stage_of(), cost.latency
    idx = {p: cost.index[p] for p in stage_of if p in cost.index}
    last = {p: start.get(p, 0.0) for p in idx}
    for iv in sim.intervals:
        last[iv.node] = max(last.get(iv.node, 0.0), iv.end)
    origins = [p for p in idx if stage_of[p] == 0]
    done = {}
    for p, i in idx.items():
        notices = [last[o] + cost.overheads.hop_s + float(lat[cost.index[o], i]) for o in origins if o != p]
        done[p] = last[p] if stage_of[p] == 0 else max([last[p], *notices])
    exchanged, end, arrival = {}, {}, {}
    for p, i in idx.items():
        s = stage_of[p]
        others = [cost.index[r] for r in idx if r != p and stage_of[r] == s]
        t = arrival[p] = done[p]
        if others and cost.stage_param_bytes(s) > 0:
            arrival[p] = max(t, *(done[cost.topology.node_ids[j]] + cost.share(s, j, i) for j in others))
            t = max(t, (earlier or {}).get(p, 0.0)) if cost.delayed_exchange else arrival[p]
        exchanged[p] = t
        end[p] = t + cost.step(s) if s < len(cost.layers) else t
    return Boundary(done, exchanged, end, arrival if cost.delayed_exchange else None)


def _measured(start: dict[str, float], b: Boundary, origins: list[str]) -> float:
    return max(b.end_s[o] for o in origins) - min(start.get(o, 0.0) for o in origins)


def predict(schedule: Schedule, topology: Topology, cost: CostModel | None = None,
            rounds: int = ROUNDS) -> Prediction:
    """Steady-state iteration time of `schedule` on `topology` (see the module docstring)."""
    cost = cost or CostModel(topology, wire=schedule_codecs(schedule))
    stage_of = schedule.stage_of()
    origins = [p for p, s in stage_of.items() if s == 0 and p in cost.index]
    ov = cost.overheads
    start: dict[str, float] = {}
    times: list[float] = []
    periods: list[float] = []
    overflows = 0
    earlier: dict[str, float] | None = None     # delayed updates: the previous round's shares
    for k in range(1, max(1, rounds) + 1):
        sim = simulate(schedule, topology, cost, available=start)
        overflows = max(overflows, sim.memory_overflows)
        b = boundary(schedule, sim, cost, start, earlier)
        times.append(_measured(start, b, origins) if origins else sim.iteration_time_s)
        nxt = {p: t + (ov.origin_gap_s if stage_of[p] == 0 else ov.peer_gap_s) for p, t in b.end_s.items()}
        base = min((nxt[o] for o in origins), default=0.0)     # the next iteration's first start
        periods.append(base)
        if b.arrival_s is not None:
            earlier = {p: t - base for p, t in b.arrival_s.items()}
        nxt = {p: max(0.0, t - base) for p, t in nxt.items()}
        if all(abs(nxt[p] - start.get(p, 0.0)) < SETTLED_S for p in nxt):
            break
        start = nxt
    # not settled: nodes may alternate between early and late, so average the last two rounds
    steady, period = (_settled(values) for values in (times, periods))
    return Prediction(steady, times[0], k, dict(start), b, sim, overflows, period)


def _settled(values: list[float]) -> float:
    """The last value, or the mean of the last two where rounds still alternate."""
    return values[-1] if len(values) < 3 or abs(values[-1] - values[-2]) < SETTLED_S else (values[-1] + values[-2]) / 2
