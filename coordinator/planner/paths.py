"""Collision-aware path scheduling (rules 1-8 of skippipe.md).

Microbatches are planned one at a time, interleaved across origins, each by a time-aware
beam search over partial paths: a state is (stages so far, nodes so far, time its forward
ends); it is expanded by every stage that rules 3-5 and the stage-balance cap allow, on the
few replicas of that stage that look cheapest from the current node. Start times come from
per-node reservation tables (TC2: a task goes into the earliest gap that fits) and per-node
activation holds (TC1: a forward starts only while fewer than m activations are held). The
surviving complete paths get their head and backward chain reserved tentatively; the path
whose backward finishes first wins and is committed. This is the prioritised-planning form of
the paper's multi-agent path finding: later agents route around earlier ones instead of CBS
re-planning both, which keeps it fast (milliseconds per microbatch).
"""
import math
from bisect import bisect_right, insort
from dataclasses import dataclass

from coordinator.planner.config import PlannerConfig
from coordinator.planner.costs import CostModel
from coordinator.planner.rules import SeqState, can_finish, step

_EPS = 1e-9
PACE_SLACK = 1    # how far a stage may run ahead of its even share while planning


class Reservations:
    """Per-node busy intervals and activation holds."""

    def __init__(self, cost: CostModel, enabled: bool, memory_limit: bool):
        n = cost.num_nodes
        self.starts = [[] for _ in range(n)]
        self.ends = [[] for _ in range(n)]
        self.holds = [[] for _ in range(n)]
        self.free_from = [0.0] * n          # per node: after every reservation and hold ends
        self.memory = cost.memory
        self.enabled, self.memory_limit = enabled, memory_limit and enabled

    def gap(self, n: int, ready: float, dur: float) -> float:
        """Earliest start >= ready of a `dur`-long task on node n that overlaps no reservation."""
        if not self.enabled:
            return ready
        starts, ends = self.starts[n], self.ends[n]
        t, i = ready, bisect_right(ends, ready + _EPS)
        while i < len(starts):
            if t + dur <= starts[i] + _EPS:
                return t
            t = max(t, ends[i])
            i += 1
        return t

    def forward_start(self, n: int, ready: float, dur: float) -> float:
        """Earliest start of a forward: a free gap while fewer than m activations are held."""
        if ready >= self.free_from[n]:      # nothing reserved or held from `ready` on
            return ready
        while True:
            t = self.gap(n, ready, dur)
            if not self.memory_limit:
                return t
            active = [e for s, e in self.holds[n] if s <= t + _EPS and e > t + _EPS]
            if len(active) < self.memory[n]:
                return t
            ready = min(active)

    def memory_conflict(self, n: int, start: float, end: float) -> float | None:
        """The first later forward start that a new hold [start, end) would push over m, else None."""
        if not self.memory_limit:
            return None
        holds = self.holds[n]
        for s0 in sorted(s for s, _ in holds if start < s < end):
            if 1 + sum(1 for s, e in holds if s <= s0 + _EPS and e > s0 + _EPS) > self.memory[n]:
                return s0
        return None

    def hold_end(self, n: int) -> float:
        """When the last activation held on n is released (0 if none)."""
        return max((e for _, e in self.holds[n]), default=0.0)

    def reserve(self, n: int, start: float, end: float) -> None:
        if self.enabled:
            i = bisect_right(self.starts[n], start)
            self.starts[n].insert(i, start)
            self.ends[n].insert(i, end)
            self.free_from[n] = max(self.free_from[n], end)

    def hold(self, n: int, start: float, end: float) -> None:
        self.holds[n].append((start, end))
        if self.memory_limit:
            self.free_from[n] = max(self.free_from[n], end)


@dataclass
class _State:
    stages: tuple
    nodes: tuple
    f_starts: tuple
    f_end: float
    seq: SeqState
    score: float


@dataclass(frozen=True)
class PlannedPath:
    microbatch_id: int
    stages: tuple[int, ...]
    nodes: tuple[int, ...]
    tasks: tuple[tuple[int, str, float, float], ...]   # (node, "F"/"H"/"B", start, end)
    end: float


class PathPlanner:
    def __init__(self, cost: CostModel, stage_of: list[int], length: int, cfg: PlannerConfig,
                 total_microbatches: int):
        self.cost, self.stage_of, self.length, self.cfg = cost, stage_of, length, cfg
        self.num_stages = len(cost.layers)
        self.res = Reservations(cost, cfg.collision_avoidance, cfg.memory_limit)
        self.members = [[n for n, s in enumerate(stage_of) if s == st] for st in range(self.num_stages)]
        others = max(1, self.num_stages - 1)
        self.share = (length - 1) / others            # fraction of microbatches each stage gets
        self.cap = math.ceil(total_microbatches * self.share - _EPS) + cfg.balance_slack
        self.visits = [0] * self.num_stages
        self.planned = 0
        self.total = total_microbatches
        self.node_load = [0] * cost.num_nodes
        self.shortlist = self._shortlists()

    def _shortlists(self):
        """Per (node, stage): replicas of the stage sorted by link + compute cost from the node."""
        c, k = self.cost, 2 * self.cfg.candidates_per_stage
        out = {}
        for a in range(c.num_nodes):
            for st in range(1, self.num_stages):
                ms = sorted(self.members[st], key=lambda n: (c.xfer_list[a][n] + c.fwd_list[n][st]
                                                             + c.bwd_list[n][st], n))
                out[(a, st)] = ms[:k]
        return out

    def _allowed(self, st: int, level: int) -> bool:
        """Stage-balance cap (rule 6). level 0: paced quota, 1: final cap only, 2: no cap."""
        if not self.cfg.stage_balance or level >= 2:
            return True
        if self.visits[st] >= self.cap:
            return False
        # Pace the quota through the iteration so late microbatches are not left the bad stages.
        paced = math.ceil((self.planned + 1) * self.share - _EPS) + PACE_SLACK + self.cfg.balance_slack
        return level >= 1 or self.visits[st] < paced

    def _must(self, level: int) -> frozenset:
        """Stages whose remaining quota needs every microbatch still to plan (this one included)."""
        if not self.cfg.stage_balance or level >= 2:
            return frozenset()
        left = self.total - self.planned
        exact = self.total * self.share
        return frozenset(st for st in range(1, self.num_stages)
                         if math.floor(exact + _EPS) - self.visits[st] >= left)

    def _quota_feasible(self, stages, level: int) -> bool:
        """After this path, can the microbatches still to plan meet every stage's cap and floor?
        A stage takes at most one visit per microbatch, hence the min(., left)."""
        if not self.cfg.stage_balance or level >= 2:
            return True
        left = self.total - self.planned - 1
        slots = left * (self.length - 1)
        floor = math.floor(self.total * self.share + _EPS)
        room = need = 0
        for st in range(1, self.num_stages):
            v = self.visits[st] + (st in stages)
            room += min(max(0, self.cap - v), left)
            need += max(0, floor - v)
            if floor - v > left:
                return False
        return room >= slots >= need

    def _must_reachable(self, missing, seq: SeqState, remaining: int) -> bool:
        """Can the stages in `missing` still be visited (above the frontier, or by a legal swap)?"""
        if len(missing) > remaining:
            return False
        cfg = self.cfg
        below = [m for m in missing if m < seq.frontier]
        if not below:
            return True
        if not cfg.allow_swaps or seq.swaps + len(below) > cfg.max_swaps:
            return False
        dists = [seq.frontier - m for m in below]
        return max(dists) <= cfg.max_swap_distance and seq.swap_distance + sum(dists) <= cfg.max_total_swap_distance

    def _expand(self, state: _State, origin: int, level: int, must: frozenset) -> list[_State]:
        out = []
        remaining = self.length - len(state.stages) - 1
        last = state.nodes[-1]
        allowed = {st for st in range(1, self.num_stages) if self._allowed(st, level)}
        for st in sorted(allowed):
            seq = step(state.seq, st, state.stages, self.cfg)
            if seq is None:
                continue
            visited = set(state.stages) | {st}
            if not self._must_reachable(must - visited, seq, remaining):
                continue
            if remaining == 0 and not self._quota_feasible(visited, level):
                continue
            if not can_finish(seq, visited, remaining, self.num_stages, self.cfg, allowed):
                continue
            for score, n, t, f_end in self._options(state.f_end, last, st, origin):
                out.append(_State(state.stages + (st,), state.nodes + (n,), state.f_starts + (t,),
                                  f_end, seq, score))
        return out

    def _options(self, f_end0: float, last: int, st: int, origin: int) -> list[tuple]:
        """The `candidates_per_stage` best (score, node, start, forward end) of stage st's shortlist
        after `last`, score = forward end + the link back to the origin + a load tie-break.
        Candidates are timed in the order of their score with no wait (a lower bound, since a
        start only moves later), and timing stops once no untimed one can enter the best: the
        same options as timing every one, with fewer reservation-table searches."""
        c, k, load = self.cost, self.cfg.candidates_per_stage, self.node_load
        fwd, back = c.fwd_list, c.xfer_list
        lbs = []
        for n in self.shortlist[(last, st)]:
            ready = f_end0 + back[last][n]
            lbs.append((ready + fwd[n][st] + back[n][origin] + 1e-3 * load[n], n, ready))
        lbs.sort()
        options = []
        for lb, n, ready in lbs:
            if len(options) >= k and options[k - 1][:2] < (lb, n):
                break
            t = self.res.forward_start(n, ready, fwd[n][st])
            f_end = t + fwd[n][st]
            insort(options, (f_end + back[n][origin] + 1e-3 * load[n], n, t, f_end))
        return options[:k]

    def _finish(self, state: _State, origin: int, mb: int) -> PlannedPath | None:
        """Time the whole path, its head and backward reserved tentatively (not committed).

        A hold [forward start, backward end) that would cover a later planned forward start on a
        full node (TC1) is not accepted as is: that hop's forward is moved past the conflicting
        start and the path re-timed. Starts only move later, so this converges; bounded anyway."""
        for _ in range(4 * self.length + 4):
            path, b_end = self._time(state, origin, mb)
            for i, (n, s) in enumerate(zip(state.nodes, state.f_starts)):
                s0 = self.res.memory_conflict(n, s, b_end[n])
                if s0 is not None:
                    state = self._retime(state, origin, {i: s0})
                    break
            else:
                return path
        return None

    def _time(self, state: _State, origin: int, mb: int):
        c, res = self.cost, self.res
        tasks = [(n, "F", s, s + c.fwd_list[n][st]) for n, st, s in zip(state.nodes, state.stages, state.f_starts)]
        last = state.nodes[-1]
        h0 = res.gap(origin, state.f_end + c.xfer_list[last][origin], c.head_list[origin])
        tasks.append((origin, "H", h0, h0 + c.head_list[origin]))
        t, prev = h0 + c.head_list[origin], origin
        b_end = {}
        for n, st in zip(reversed(state.nodes), reversed(state.stages)):
            dur = c.bwd_list[n][st]
            ready = t + c.xfer_list[prev][n]
            # The origin's own head sits in its table only after commit: keep B0 after it.
            s = res.gap(n, max(ready, h0 + c.head_list[origin]) if n == origin else ready, dur)
            tasks.append((n, "B", s, s + dur))
            b_end[n], t, prev = s + dur, s + dur, n
        return PlannedPath(mb, state.stages, state.nodes, tuple(tasks), t), b_end

    def _retime(self, state: _State, origin: int, floors: dict) -> _State:
        """Recompute the forward starts, hop i no earlier than floors[i]; earlier hops keep theirs."""
        c, first = self.cost, min(floors)
        starts = list(state.f_starts[:first])
        f_end = starts[-1] + c.fwd_list[state.nodes[first - 1]][state.stages[first - 1]] if first else 0.0
        for i in range(first, len(state.nodes)):
            n, st = state.nodes[i], state.stages[i]
            ready = state.f_starts[0] if i == 0 else f_end + c.xfer_list[state.nodes[i - 1]][n]
            t = self.res.forward_start(n, max(ready, floors.get(i, 0.0)), c.fwd_list[n][st])
            starts.append(t)
            f_end = t + c.fwd_list[n][st]
        return _State(state.stages, state.nodes, tuple(starts), f_end, state.seq, state.score)

    def _finish_safe(self, state: _State, origin: int, mb: int) -> PlannedPath:
        """Every hop after all activations its node holds are released: always within memory."""
        floors = {i: self.res.hold_end(n) for i, n in enumerate(state.nodes)}
        return self._time(self._retime(state, origin, floors), origin, mb)[0]

    def plan_one(self, mb: int, origin: int, release: float = 0.0) -> PlannedPath:
        for level in (0, 1, 2):                 # a dead end relaxes the balance pacing, then the cap
            best = self._search(mb, origin, release, level)
            if best is not None:
                self.commit(best)
                return best
        raise RuntimeError(f"no legal path for microbatch {mb}")  # unreachable for valid configs

    def _search(self, mb, origin, release, level):
        c, must = self.cost, self._must(level)
        t0 = self.res.forward_start(origin, release, c.fwd_list[origin][0])
        beam = [_State((0,), (origin,), (t0,), t0 + c.fwd_list[origin][0], SeqState(), 0.0)]
        for _ in range(self.length - 1):
            nxt = [s for st in beam for s in self._expand(st, origin, level, must)]
            nxt.sort(key=lambda s: (s.score, s.stages, s.nodes))
            beam = nxt[:self.cfg.beam_width * (1 + 3 * level)]   # widen when the quota is tight
            if not beam:
                return None
        done = [p for p in (self._finish(s, origin, mb) for s in beam) if p is not None]
        if not done:   # re-timing did not settle: run the best candidate after every held activation
            return self._finish_safe(beam[0], origin, mb)
        return min(done, key=lambda p: (p.end, p.stages, p.nodes))

    def commit(self, path: PlannedPath) -> None:
        ends = {}
        for n, kind, s, e in path.tasks:
            self.res.reserve(n, s, e)
            if kind == "B":
                ends[n] = e
        for n, (_, kind, s, _) in zip(path.nodes, path.tasks):
            self.res.hold(n, s, ends[n])
            self.node_load[n] += 1
        for st in path.stages[1:]:
            self.visits[st] += 1
        self.planned += 1
