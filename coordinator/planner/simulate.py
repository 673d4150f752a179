"""Discrete-event simulator of one training iteration of a Schedule.

Model (hand-checkable, see tests/unit/coordinator/test_simulate.py):
- Each microbatch is a chain of tasks: F(hop 0) ... F(hop L-1), H (head + loss on the origin),
  B(hop L-1) ... B(hop 0). Between consecutive tasks on different nodes the activation (or its
  gradient) is transferred: latency + bytes / bandwidth (+ the cost model's fixed hop cost; a
  link the schedule quantises, Schedule.wire, carries fewer bytes and adds the codec's time).
- A node runs one task at a time, by the rule peers run (peer/pipeline/plan_view.py
  `priority_of`): of its ready tasks it starts the one listed first in its per-node order
  (Schedule.order) and never idles while one is ready. A head the order does not list ranks just
  before that microbatch's backward; tasks the order does not list rank after every listed one,
  heads first, the rest first come first served (the runtime's FIFO), ties by microbatch id.
  Without an order every task is unlisted. (Idling for the next listed task would need a way to
  tell a late task from one that never comes, e.g. a rerouted microbatch.)
- Memory (TC1): a node holds a microbatch's activation from the start of its forward until the
  end of its backward; it does not start a forward while it holds `memory_microbatches`, and a
  forward starts only if the slots left also cover every forward listed before it that has not
  started yet (a reservation: running out of order never takes a slot the order counted on, so
  it cannot deadlock where the order would not).
- Links: a directed link carries one transfer at a time, first come first served; latency
  overlaps with the next transfer. (A simplification of fair bandwidth sharing: the last of a
  burst finishes at the same time, the first ones earlier.) NICs are not shared across links.
- If memory deadlocks, a forward runs over the limit (counted in `memory_overflows`), so the
  simulation always ends.
- At the end every stage averages its replicas: iteration time = max over stages of
  (last backward on that stage + averaging cost; without the averaging with delayed updates,
  Workload.delayed_exchange: steady.py prices that exchange against the next iteration).
- `available` (optional, per node id): a node starts nothing before that time (it is still
  busy with the previous iteration: coordinator/planner/steady.py). Default: all free at 0.
"""
import bisect
import heapq
from dataclasses import dataclass

from coordinator.planner.config import PlanningError
from coordinator.planner.costs import CostModel, schedule_codecs
from protocol.schedule import Phase, Schedule
from protocol.topology import Topology


@dataclass(frozen=True)
class TaskInterval:
    node: str
    microbatch_id: int
    kind: str          # "F" forward, "H" head + loss, "B" backward
    stage: int
    hop: int
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    iteration_time_s: float
    busy_s: dict[str, float]
    busy_fraction: dict[str, float]
    intervals: tuple[TaskInterval, ...]
    stage_finish_s: dict[int, float]
    averaging_s: dict[int, float]
    memory_overflows: int = 0


class _Tasks:
    """Flat arrays describing every task of the iteration."""

    def __init__(self, schedule: Schedule, cost: CostModel):
        self.node, self.dur, self.kind, self.mb, self.stage, self.hop, self.succ = ([] for _ in range(7))
        self.key = {}                                   # (mb, kind, node) -> task id
        for route in schedule.routes:
            nodes = []
            for h in route.hops:
                if h.peer not in cost.index:
                    raise PlanningError(f"route {route.microbatch_id} uses unknown node {h.peer!r}")
                nodes.append(cost.index[h.peer])
            stages = [h.stage for h in route.hops]
            if any(s >= len(cost.layers) for s in stages):
                raise PlanningError(f"route {route.microbatch_id} visits a stage that does not exist")
            chain = [("F", j) for j in range(len(nodes))] + [("H", 0)]
            chain += [("B", j) for j in reversed(range(len(nodes)))]
            for i, (kind, j) in enumerate(chain):
                n, s = nodes[j], stages[j]
                dur = {"F": cost.fwd_list[n][s], "B": cost.bwd_list[n][s], "H": cost.head_list[n]}[kind]
                self.key[(route.microbatch_id, kind, n)] = len(self.node)
                self._add(n, dur, kind, route.microbatch_id, s, j, i + 1 < len(chain))

    def _add(self, n, dur, kind, mb, stage, hop, has_succ):
        t = len(self.node)
        self.node.append(n), self.dur.append(dur), self.kind.append(kind)
        self.mb.append(mb), self.stage.append(stage), self.hop.append(hop)
        self.succ.append(t + 1 if has_succ else -1)


class _Sim:
    def __init__(self, tasks: _Tasks, cost: CostModel, ranks: list[float], memory_limit: bool, link_contention: bool,
                 available: list[float]):
        self.t, self.cost = tasks, cost
        n = cost.num_nodes
        self.rank = ranks                    # per task: position in its node's order (UNLISTED...)
        self.waiting = [[] for _ in range(n)]   # per node: sorted ranks of listed forwards not started
        for t, r in enumerate(ranks):
            if tasks.kind[t] == "F" and r < UNLISTED - 1:
                self.waiting[tasks.node[t]].append(r)
        for w in self.waiting:
            w.sort()
        self.ready = [[] for _ in range(n)]  # per node: ready task ids
        self.ready_at = {}
        self.busy = [False] * n
        self.held = [0] * n
        self.memory_limit, self.link_contention = memory_limit, link_contention
        self.link_free = {}
        self.events, self.counter = [], 0
        self.start, self.end = {}, {}
        self.now, self.overflows = 0.0, 0
        for node, t in enumerate(available):
            if t > 0:                        # busy until then; a "free" event releases it
                self.busy[node] = True
                self.push(t, "free", node)

    def push(self, time, kind, task):
        self.counter += 1
        heapq.heappush(self.events, (time, self.counter, kind, task))

    def mem_ok(self, task):
        if self.t.kind[task] != "F" or not self.memory_limit:
            return True
        n = self.t.node[task]
        reserved = bisect.bisect_left(self.waiting[n], self.rank[task])   # listed before, not started
        return self.held[n] + reserved < self.cost.memory[n]

    def pick(self, n):
        ok = [x for x in self.ready[n] if self.mem_ok(x)]
        return min(ok, key=lambda x: (self.rank[x], self.ready_at[x], self.t.mb[x], x)) if ok else None

    def run(self, n, task):
        self.ready[n].remove(task)
        self.busy[n] = True
        if self.t.kind[task] == "F":
            self.held[n] += 1
            if self.rank[task] < UNLISTED - 1:
                self.waiting[n].pop(bisect.bisect_left(self.waiting[n], self.rank[task]))
        self.start[task] = self.now
        self.push(self.now + self.t.dur[task], "done", task)

    def dispatch(self, n):
        if not self.busy[n]:
            task = self.pick(n)
            if task is not None:
                self.run(n, task)

    def finish(self, task):
        n = self.t.node[task]
        self.end[task], self.busy[n] = self.now, False
        if self.t.kind[task] == "B":
            self.held[n] -= 1
        nxt = self.t.succ[task]
        if nxt >= 0:
            m = self.t.node[nxt]
            arrive = self.now
            if m != n:
                trans = self.cost.transmission(n, m)
                begin = max(self.now, self.link_free.get((n, m), 0.0)) if self.link_contention else self.now
                self.link_free[(n, m)] = begin + trans
                arrive = (begin + trans + float(self.cost.latency[n, m]) + float(self.cost.hop[n, m])
                          + float(self.cost.codec_s[n, m]))     # quantised links: encode + decode
            self.push(arrive, "ready", nxt)
        self.dispatch(n)

    def unstick(self) -> bool:
        """Memory deadlock: start the earliest-ready task over the limit. True if one started."""
        idle = [n for n in range(len(self.busy)) if not self.busy[n] and self.ready[n]]
        cands = [(self.ready_at[x], x) for n in idle for x in self.ready[n]]
        if not cands:
            return False
        _, task = min(cands)
        self.overflows += 1
        self.run(self.t.node[task], task)
        return True

    def loop(self):
        for task, kind in enumerate(self.t.kind):
            if kind == "F" and self.t.hop[task] == 0:
                self.push(0.0, "ready", task)
        while True:
            while self.events:
                self.now, _, kind, task = heapq.heappop(self.events)
                if kind == "free":
                    self.busy[task] = False      # `task` is a node index here
                    self.dispatch(task)
                elif kind == "ready":
                    n = self.t.node[task]
                    self.ready_at[task] = self.now
                    self.ready[n].append(task)
                    self.dispatch(n)
                else:
                    self.finish(task)
            if len(self.end) == len(self.t.node) or not self.unstick():
                break
        if len(self.end) != len(self.t.node):
            raise PlanningError("simulation deadlocked")


UNLISTED = 1e9          # after every listed position, as peer/pipeline/plan_view.py's UNPLANNED


def _ranks(schedule: Schedule, tasks: _Tasks, cost: CostModel) -> list[float]:
    """Each task's rank on its node under the peers' rule (see the module docstring)."""
    rank = [UNLISTED - 1 if k == "H" else UNLISTED for k in tasks.kind]
    for po in schedule.order:
        n = cost.index.get(po.peer)
        if n is None:
            continue
        forwards: set[int] = set()
        for pos, e in enumerate(po.tasks):
            if e.phase == Phase.BACKWARD:
                kind = "B"
            else:                                       # origin: FORWARD twice = F0, then head
                kind = "H" if e.microbatch_id in forwards else "F"
                forwards.add(e.microbatch_id)
            t = tasks.key.get((e.microbatch_id, kind, n))
            if t is not None and rank[t] >= UNLISTED - 1:
                rank[t] = float(pos)
    for (mb, kind, node), t in tasks.key.items():       # an unlisted head: just before its backward
        b = tasks.key.get((mb, "B", node))
        if kind == "H" and rank[t] >= UNLISTED - 1 and b is not None and rank[b] < UNLISTED - 1:
            rank[t] = rank[b] - 0.5
    return rank


def simulate(schedule: Schedule, topology: Topology, cost: CostModel | None = None,
             memory_limit: bool = True, link_contention: bool = True,
             available: dict[str, float] | None = None) -> SimResult:
    """Simulate one iteration of `schedule` on `topology` (see the module docstring)."""
    cost = cost or CostModel(topology, wire=schedule_codecs(schedule))
    tasks = _Tasks(schedule, cost)
    free_at = [max(0.0, (available or {}).get(i, 0.0)) for i in topology.node_ids]
    sim = _Sim(tasks, cost, _ranks(schedule, tasks, cost), memory_limit, link_contention, free_at)
    sim.loop()
    ids = topology.node_ids
    intervals = tuple(TaskInterval(ids[tasks.node[t]], tasks.mb[t], tasks.kind[t], tasks.stage[t],
                                   tasks.hop[t], sim.start[t], sim.end[t]) for t in range(len(tasks.node)))
    busy = {i: 0.0 for i in ids}
    last_b: dict[int, float] = {}
    for iv in intervals:
        busy[iv.node] += iv.end - iv.start
        if iv.kind == "B":
            last_b[iv.stage] = max(last_b.get(iv.stage, 0.0), iv.end)
    replicas: dict[int, list[int]] = {}
    for a in schedule.assignment:
        if a.peer in cost.index:
            replicas.setdefault(a.stage, []).append(cost.index[a.peer])
    averaging = {s: cost.averaging(s, r) for s, r in sorted(replicas.items()) if s < len(cost.layers)}
    on_path = 0.0 if cost.delayed_exchange else 1.0     # delayed updates: the exchange overlaps the next iteration
    finish = {s: last_b.get(s, 0.0) + on_path * averaging.get(s, 0.0) for s in sorted(set(last_b) | set(averaging))}
    total = max(finish.values(), default=0.0)
    frac = {i: (b / total if total > 0 else 0.0) for i, b in busy.items()}
    return SimResult(total, busy, frac, intervals, finish, averaging, sim.overflows)
