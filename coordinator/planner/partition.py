"""Nodes -> stages.

Instead of the paper's genetic search, a simulated-annealing local search (swap two nodes'
stages, or move a replica between stages >= 1) over a vectorised analytic estimate of the
iteration time; the estimate is a max of lower bounds:
- per origin o: its microbatches' round trips, M / m_o waves of
  (stage-0 work + share x sum over stages of the cheapest "o -> replica -> o" detour),
  which rewards partitions that put a replica of every stage near every data node; for the
  full pipeline (`pipelines`) the round trip along o's own chain (pipelines.py) instead,
  since there a hop's cost is the link from the previous stage's replica, not from o;
- per origin: its own compute M x (F0 + head + B0);
- per stage: the stage's microbatch visits / the summed speed of its replicas;
plus the replica averaging of each stage. Pinned nodes (Node.stage >= 0) never move; stage 0
has exactly `data_nodes` nodes; every stage keeps >= 1 node.
"""
import math
import random

import numpy as np

from coordinator.planner.config import PlanningError
from coordinator.planner.costs import CostModel
from coordinator.planner.pipelines import pipeline_chains


def data_node_count(num_nodes: int, num_stages: int, length: int, pinned0: int, requested: int) -> int:
    """Stage-0 size: requested, else N / path length (balances stage-0 and stage >= 1 work)."""
    d = requested or max(1, round(num_nodes / max(1, length)))
    d = max(d, pinned0, 1)
    if num_nodes - d < num_stages - 1:
        d = num_nodes - (num_stages - 1)
    if d < max(1, pinned0):
        raise PlanningError(f"{num_nodes} nodes cannot give stage 0 {max(1, pinned0)} data nodes "
                            f"and every other of the {num_stages} stages a node")
    return d


class PartitionScore:
    """Score of a partition (lower is better). Pure and deterministic, so it remembers what it
    scored: one plan's annealing runs revisit the same partitions over and over (6 nodes: 120
    distinct of 12,410 scored), and a plan shares one PartitionScore among its runs."""

    MEMO_LIMIT = 200_000     # partitions remembered (a plan scores ~25k at most by default)

    def __init__(self, cost: CostModel, length: int, microbatches: int, pipelines: bool = False):
        self.c, self.m, self.pipelines = cost, microbatches, pipelines
        self._memo: dict[bytes, float] = {}
        s = len(cost.layers)
        self.stages = np.arange(s)
        self.share = (length - 1) / max(1, s - 1)
        self.fb = cost.fwd + cost.bwd                                  # [node, stage]
        self.stage0 = cost.fwd[:, 0] + cost.bwd[:, 0] + cost.head
        self.waves = np.array([math.ceil(microbatches / m) for m in cost.memory], dtype=float)
        # [stage, a, b]: replica a's share of the stage arriving at b (CostModel.share), 0 on
        # the diagonal and for stages without parameters; the score is called thousands of
        # times, so the pairs are priced once here
        n = cost.num_nodes
        self.pair_share = np.zeros((s, n, n))
        for st in range(s):
            if cost.stage_param_bytes(st) > 0:
                self.pair_share[st] = [[cost.share(st, a, b) for b in range(n)] for a in range(n)]

    def __call__(self, stage_of: np.ndarray) -> float:
        key = stage_of.tobytes()
        score = self._memo.get(key)
        if score is None:
            score = self._score(stage_of)
            if len(self._memo) < self.MEMO_LIMIT:
                self._memo[key] = score
        return score

    def _score(self, stage_of: np.ndarray) -> float:
        members = stage_of[None, :] == self.stages[:, None]            # [stage, node]
        origins = np.flatnonzero(members[0])
        own = self.fb[np.arange(len(stage_of)), stage_of]              # node's work on its stage
        trip = self.stage0[origins] + (self._chains(stage_of, origins, own) if self.pipelines else
                                       self._detours(members, origins, own))
        bound = float(self.m * self.stage0[origins].max())
        speed = (members[1:] / own[None, :]).sum(axis=1)               # stages >= 1: summed replica speed
        if len(speed):
            bound = max(bound, len(origins) * self.m * self.share / float(speed.min()))
        same_stage = members[:, :, None] & members[:, None, :]
        avg = float(np.where(same_stage, self.pair_share, 0.0).max())  # the slowest stage's exchange
        waves = trip * self.waves[origins]
        score = max(bound, float(waves.max())) + 0.1 * float(waves.mean())
        if self.c.delayed_exchange:      # the exchange overlaps the next iteration: only its excess counts
            return score + max(0.0, avg - score)
        return score + avg

    def _detours(self, members: np.ndarray, origins: np.ndarray, own: np.ndarray) -> np.ndarray:
        detour = self.c.round_trip[origins] + own[None, :]              # [origin, node]
        nearest = np.where(members[1:, None, :], detour[None, :, :], np.inf).min(axis=2)   # [stage, origin]
        return self.share * nearest.sum(axis=0)

    def _chains(self, stage_of: np.ndarray, origins: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Per origin: its slowest microbatch's round trip along its pipeline (pipelines.py)."""
        slots = [int(o) for o in origins for _ in range(self.m)]
        rt = self.c.round_trip
        chains = np.array(pipeline_chains(stage_of.tolist(), len(self.c.layers), rt, slots))   # [chain, stage]
        trips = rt[chains, np.roll(chains, -1, axis=1)].sum(axis=1) + own[chains[:, 1:]].sum(axis=1)
        per_origin = trips.reshape(len(origins), self.m)        # slots run origin by origin
        return per_origin.max(axis=1)


def auto_partitions(num_nodes: int) -> int:
    """Candidate partitions when not configured: 48 up to 12 nodes, then fewer (576 / N, at
    least 3), since each costs a path plan and a simulation that grow with the swarm: ~5-8 s
    a plan on 12 nodes, ~25-50 s on 64 with 48 candidates."""
    return max(3, min(48, 576 // max(1, num_nodes)))


def auto_partition_iters(num_nodes: int, partitions: int) -> int:
    """Annealing steps per run when not configured: the budget three partitions of 60000 / N
    steps (400-4000) used to get, shared by `partitions` runs, at least 200 each."""
    budget = 3 * max(400, min(4000, 60000 // max(1, num_nodes)))
    return max(200, budget // max(1, partitions))


def _initial(n: int, s: int, d: int, pinned: list[int], rng: random.Random) -> np.ndarray:
    stage_of = np.array(pinned, dtype=int)
    free = [i for i in range(n) if pinned[i] < 0]
    rng.shuffle(free)
    counts = [int((stage_of == st).sum()) for st in range(s)]
    for i in free:                                   # fill stage 0 first, then the emptiest stage
        st = 0 if counts[0] < d else min(range(1, s), key=lambda x: (counts[x], x))
        stage_of[i] = st
        counts[st] += 1
    if min(counts) == 0:
        raise PlanningError("too few unpinned nodes: some stage would have no node")
    return stage_of


def _neighbour(stage_of: np.ndarray, free: list[int], s: int, rng: random.Random) -> np.ndarray | None:
    new = stage_of.copy()
    a = rng.choice(free)
    if rng.random() < 0.5 or stage_of[a] == 0:
        b = rng.choice(free)
        if stage_of[a] == stage_of[b]:
            return None
        new[a], new[b] = stage_of[b], stage_of[a]
        return new
    if (stage_of == stage_of[a]).sum() <= 1:
        return None
    new[a] = rng.randrange(1, s)
    return None if new[a] == stage_of[a] else new


def partition_score(cost: CostModel, length: int, data_nodes: int, pipelines: bool = False) -> PartitionScore:
    """The score partition() anneals with; `pipelines`: score the full pipeline's chains."""
    w = cost.topology.workload     # with a fixed global batch, score each data node's average share of it
    per_node = max(1, round(w.global_batch / data_nodes)) if w.global_batch and data_nodes else w.microbatches_per_data_node
    return PartitionScore(cost, length, per_node, pipelines)


def partition(cost: CostModel, length: int, data_nodes: int, iters: int, rng: random.Random,
              pipelines: bool = False, score: PartitionScore | None = None) -> list[int]:
    """Stage index per node (topology order); `pipelines`: score the full pipeline's chains;
    `score`: partition_score(...) of the same arguments, shared by the calls of one plan."""
    topo = cost.topology
    n, s = cost.num_nodes, len(cost.layers)
    if n < s:
        raise PlanningError(f"topology has {n} nodes but {s} stages need at least {s}")
    pinned = [node.stage for node in topo.nodes]
    if sum(1 for p in pinned if p == 0) > data_nodes:
        raise PlanningError("more nodes are pinned to stage 0 than there are data nodes")
    score = score or partition_score(cost, length, data_nodes, pipelines)
    free = [i for i in range(n) if pinned[i] < 0]
    best, best_score = None, math.inf
    iters = iters or auto_partition_iters(n, 3)
    for _ in range(2):                                # two annealing runs, keep the better
        cur = _initial(n, s, data_nodes, pinned, rng)
        cur_score = score(cur)
        t0 = 0.05 * cur_score
        for i in range(iters if len(free) > 1 else 0):
            cand = _neighbour(cur, free, s, rng)
            if cand is None:
                continue
            cs = score(cand)
            temp = t0 * (1.0 - i / iters) + 1e-9
            if cs <= cur_score or rng.random() < math.exp((cur_score - cs) / temp):
                cur, cur_score = cand, cs
                if cs < best_score:
                    best, best_score = cand.copy(), cs
        if cur_score < best_score:
            best, best_score = cur.copy(), cur_score
    return [int(x) for x in best]
