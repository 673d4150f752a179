"""The lower bound on a schedule's period (coordinator/planner/bound.py): exact where nothing
waits, and never above the simulated steady period of a planned schedule."""
import dataclasses
import random

import pytest

from coordinator.planner import PlanConfig, plan, predict
from coordinator.planner.bound import lower_bound
from coordinator.planner.presets import make_topology
from tests.unit.coordinator.test_steady import sched, topo


def test_one_microbatch_on_a_chain_meets_the_bound_exactly():
    # n0 -> n1 and back, no replicas, nothing to exchange: F0 1 + hop 1.1 + F1 2 + hop 1.1 +
    # head 0.25 + hop 1.1 + B1 3 + hop 1.1 + B0 1.5 = 12.15 (tests/unit/coordinator/test_steady.py's numbers)
    t = topo(fwd=(1.0, 2.0), param=0)
    chain = sched([(0, [(0, "n0"), (1, "n1")])], {"n0": 0, "n1": 1})
    assert lower_bound(chain, t) == pytest.approx(12.15)
    assert predict(chain, t).period_s == pytest.approx(12.15)


def test_an_origin_with_one_memory_slot_runs_its_microbatches_one_after_another():
    t = topo(fwd=(1.0, 2.0), param=0)
    t = dataclasses.replace(t, workload=dataclasses.replace(t.workload, memory_microbatches=1))
    three = sched([(mb, [(0, "n0"), (1, "n1")]) for mb in range(3)], {"n0": 0, "n1": 1})
    assert lower_bound(three, t) == pytest.approx(3 * 12.15)
    assert predict(three, t).period_s >= lower_bound(three, t) - 1e-9


def test_an_origin_starts_its_microbatches_one_stage_0_forward_apart():
    # three slots, three microbatches: none waits for memory, but n0 runs one stage-0 forward
    # (1 s) and one stage-0 backward (1.5 s) at a time, so the last one ends 2 x 1.5 s after a
    # single microbatch's 12.15 s at best; the simulator (which must respect it) takes longer
    t = topo(fwd=(1.0, 2.0), param=0)
    three = sched([(mb, [(0, "n0"), (1, "n1")]) for mb in range(3)], {"n0": 0, "n1": 1})
    assert lower_bound(three, t) == pytest.approx(12.15 + 2 * 1.5)
    assert predict(three, t).period_s >= lower_bound(three, t) - 1e-9


def test_lanes_bound_counts_memory_rounds_and_serial_starts():
    from coordinator.planner.bound import lanes_bound
    assert lanes_bound(1, 3, 10.0, 1.0) == 10.0
    assert lanes_bound(3, 3, 10.0, 1.0) == 12.0          # starts 0, 1, 2
    assert lanes_bound(6, 3, 10.0, 1.0) == 22.0          # starts 0, 1, 2, 10, 11, 12
    assert lanes_bound(4, 1, 10.0, 1.0) == 40.0          # one slot: one after another
    assert lanes_bound(0, 3, 10.0, 1.0) == 0.0


@pytest.mark.parametrize("preset,seed", [("geo", 0), ("geo", 1), ("clusters", 2)])
@pytest.mark.parametrize("strategy,skip", [("skippipe", 1 / 3), ("full", 0.0)])
def test_planned_schedules_never_beat_the_bound(preset, seed, strategy, skip):
    t = make_topology(preset, 10, random.Random(seed), stages=4, layers=8, microbatches=4)
    schedule = plan(t, PlanConfig(strategy, skip), seed)
    bound, period = lower_bound(schedule, t), predict(schedule, t).period_s
    assert 0 < bound <= period + 1e-9, (bound, period)
