"""A fixed global batch (issue 26): the planner splits it among the data nodes by speed, every
strategy plans exactly that many microbatches, and losing nodes changes who computes it, never
its size."""
import dataclasses
import random

import pytest

from coordinator.planner import PlanConfig, plan
from coordinator.planner.config import PlannerConfig
from coordinator.planner.costs import CostModel
from coordinator.planner.entry import split_batch
from coordinator.planner.presets import make_topology
from protocol.errors import FieldError
from tests.unit.coordinator.test_steady import topo


def with_batch(t, g):
    return dataclasses.replace(t, workload=dataclasses.replace(t.workload, global_batch=g))


def test_the_batch_is_split_by_speed_and_sums_up():
    cost = CostModel(topo(fwd=(1.0, 2.0, 4.0)))            # speeds 4 : 2 : 1
    assert split_batch(cost, [0, 1, 2], 14) == [7, 4, 3]     # one each, then the other 11 as 4 : 2 : 1
    assert split_batch(cost, [0, 1, 2], 4) == [2, 1, 1]     # everyone gets one while there are enough
    assert split_batch(cost, [0, 1, 2], 2) == [1, 1, 0]
    assert sum(split_batch(cost, [0, 1, 2], 101)) == 101


@pytest.mark.parametrize("strategy,skip", [("skippipe", 1 / 3), ("full", 0.0), ("random-skip", 1 / 3)])
def test_every_strategy_plans_exactly_the_global_batch_even_after_churn(strategy, skip):
    t = with_batch(make_topology("geo", 10, random.Random(3), stages=4, layers=8, microbatches=4), 13)
    quick = PlanConfig(strategy, skip, PlannerConfig(partitions=4, partition_iters=50, finalists=1, restarts=0))  # the batch, not the search
    schedule = plan(t, quick, 3)
    assert sorted(r.microbatch_id for r in schedule.routes) == list(range(13))
    fewer = dataclasses.replace(t, nodes=t.nodes[:8], links=type(t.links)(
        tuple(row[:8] for row in t.links.latency_ms[:8]), tuple(row[:8] for row in t.links.bandwidth_gib_s[:8])))
    assert len(plan(fewer, quick, 3).routes) == 13   # two nodes gone: same batch


def test_a_negative_global_batch_is_refused():
    with pytest.raises(FieldError, match="global_batch"):
        with_batch(topo(), -1)
