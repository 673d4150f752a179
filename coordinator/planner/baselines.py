"""The paper's baselines, planned on the same partition machinery and simulated the same way.

- `full` (DT-FM): every microbatch visits every stage in increasing order, along its data
  node's pipeline (pipelines.py: chains of replicas built from the cheapest links, balanced
  over the replicas). No per-node order: nodes run first come first served, as DT-FM's runtime does.
- `random-skip` (DT-FM skip): the same path length as SkipPipe, a random set of stages visited
  in increasing order (resampled until it obeys the jump rule), a random replica per stage, no
  collision awareness and no stage balancing.
"""
import random

from coordinator.planner.config import PlannerConfig, PlanningError
from coordinator.planner.costs import CostModel
from coordinator.planner.pipelines import pipeline_chains
from coordinator.planner.rules import SeqState, step

Path = tuple[int, tuple[int, ...], tuple[int, ...]]       # (microbatch id, stages, node indices)


def _members(stage_of: list[int], num_stages: int) -> list[list[int]]:
    return [[n for n, s in enumerate(stage_of) if s == st] for st in range(num_stages)]


def full_paths(cost: CostModel, stage_of: list[int], microbatches: list[tuple[int, int]]) -> list[Path]:
    """`microbatches`: (id, origin node index) in planning order."""
    s = len(cost.layers)
    chains = pipeline_chains(stage_of, s, cost.round_trip, [origin for _, origin in microbatches])
    return [(mb, tuple(range(s)), tuple(chain)) for (mb, _), chain in zip(microbatches, chains)]


def random_stages(num_stages: int, length: int, cfg: PlannerConfig, rng: random.Random) -> tuple[int, ...]:
    for _ in range(1000):
        chosen = (0,) + tuple(sorted(rng.sample(range(1, num_stages), length - 1)))
        state, ok = SeqState(), True
        for i, st in enumerate(chosen[1:], start=1):
            state = step(state, st, chosen[:i], cfg)
            if state is None:
                ok = False
                break
        if ok:
            return chosen
    raise PlanningError(f"no increasing path of {length} stages obeys max_jump={cfg.max_jump}")


def random_skip_paths(cost: CostModel, stage_of: list[int], length: int, cfg: PlannerConfig,
                      microbatches: list[tuple[int, int]], rng: random.Random) -> list[Path]:
    s = len(cost.layers)
    members, out = _members(stage_of, s), []
    for mb, origin in microbatches:
        stages = random_stages(s, length, cfg, rng)
        nodes = (origin,) + tuple(rng.choice(members[st]) for st in stages[1:])
        out.append((mb, stages, nodes))
    return out
