"""The partition score remembers what it scored (planner/partition.py): one plan's annealing
runs revisit the same few partitions, and a plan shares one score among them; the quick pass
path-plans each distinct partition once (planner/entry.py)."""
import random

import numpy as np

import coordinator.planner.entry as entry
from coordinator.planner import PlanConfig, plan
from coordinator.planner.costs import CostModel
from coordinator.planner.partition import PartitionScore, partition_score
from coordinator.planner.presets import make_topology


def test_a_remembered_score_is_the_computed_one_and_is_not_computed_again(monkeypatch):
    cost = CostModel(make_topology("geo", 8, random.Random(1), stages=3))
    score = partition_score(cost, 2, 3)
    a = np.array([0, 0, 0, 1, 1, 2, 2, 1])
    b = np.array([0, 0, 1, 1, 1, 1, 2, 2])
    first_a, first_b = score(a), score(b)
    assert first_a == score._score(a) and first_b == score._score(b) and first_a != first_b
    computed = []
    monkeypatch.setattr(score, "_score", lambda so: computed.append(so) or 0.0)
    assert score(a.copy()) == first_a and score(b.copy()) == first_b and computed == []
    assert score(np.array([0, 0, 0, 1, 2, 2, 1, 1])) == 0.0 and len(computed) == 1   # a new one is scored


def test_one_plan_scores_each_partition_once(monkeypatch):
    scored: list[bytes] = []
    real = PartitionScore._score
    monkeypatch.setattr(PartitionScore, "_score", lambda self, so: scored.append(so.tobytes()) or real(self, so))
    plan(make_topology("geo", 6, random.Random(3), stages=3), PlanConfig(), 0)
    assert scored and len(scored) == len(set(scored))        # 48 annealing runs, no partition twice
    assert entry.auto_partitions(6) == 48


def test_one_plan_path_plans_each_distinct_partition_once_before_the_finalists(monkeypatch):
    quick: list[tuple] = []
    real = entry._skippipe

    def counted(topology, config, cost, stage_of, length, rng, seed, restarts):
        if restarts == 0:
            quick.append(tuple(stage_of))
        return real(topology, config, cost, stage_of, length, rng, seed, restarts)
    monkeypatch.setattr(entry, "_skippipe", counted)
    topology = make_topology("geo", 6, random.Random(3), stages=3)
    planned = plan(topology, PlanConfig(), 0)
    assert quick and len(quick) == len(set(quick)) < entry.auto_partitions(6)
    monkeypatch.setattr(entry, "_skippipe", real)
    assert plan(topology, PlanConfig(), 0) == planned          # deterministic, as before
