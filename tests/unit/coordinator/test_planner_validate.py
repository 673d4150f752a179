"""The validator reports each violation kind."""
import dataclasses

import pytest

from coordinator.planner import PlanConfig, ViolationKind, plan, validate
from protocol.schedule import Hop, OrderEntry, PeerOrder, Phase, Route, Schedule, StageAssignment
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload

V = ViolationKind


def topo(n=8, stages=4, memory=2):
    w = Workload(num_layers=8, num_stages=stages, microbatch_samples=1, microbatches_per_data_node=2,
                 activation_bytes_per_sample=1000, memory_microbatches=memory)
    nodes = tuple(Node(f"n{i}", 0.01 * (1 + i % 3)) for i in range(n))
    lat = tuple(tuple(0.0 if i == j else 10.0 for j in range(n)) for i in range(n))
    return Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, tuple(tuple(1.0 for _ in range(n)) for _ in range(n))))


STAGE_OF = {"n0": 0, "n1": 0, "n2": 1, "n3": 1, "n4": 2, "n5": 2, "n6": 3, "n7": 3}


def sched(routes, k=0.25, order=(), stage_of=STAGE_OF):
    return Schedule("t", 0, "skippipe", 4, k, tuple(StageAssignment(p, s) for p, s in stage_of.items()),
                    tuple(Route(mb, tuple(Hop(s, p) for s, p in hops)) for mb, hops in routes), order)


# k = 0.25 with 4 stages: 3 stages per path, each of stages 1..3 gets 2 of 3 microbatches
GOOD = [(0, [(0, "n0"), (1, "n2"), (2, "n4")]), (1, [(0, "n1"), (2, "n5"), (3, "n6")]),
        (2, [(0, "n0"), (1, "n3"), (3, "n7")])]


def kinds(schedule, t=None, **cfg):
    from coordinator.planner import PlannerConfig
    return {v.kind for v in validate(schedule, t or topo(), PlannerConfig(**cfg))}


def test_good_schedule_is_valid():
    assert kinds(sched(GOOD)) == set()


@pytest.mark.parametrize("bad,kind", [
    ((0, [(0, "n0"), (1, "n2"), (1, "n3")]), V.STAGE_REPEATED),
    ((0, [(0, "n0"), (1, "n2")]), V.PATH_LENGTH),
    ((0, [(1, "n2"), (0, "n0"), (2, "n4")]), V.BAD_ORIGIN),
    ((0, [(0, "n0"), (0, "n1"), (2, "n4")]), V.STAGE_ZERO_REENTERED),
    ((0, [(0, "n0"), (1, "zz"), (2, "n4")]), V.UNKNOWN_NODE),
    ((0, [(0, "n0"), (1, "n4"), (2, "n5")]), V.WRONG_STAGE),
    ((0, [(0, "n0"), (2, "n4"), (1, "n2")]), None),            # adjacent swap is fine
    ((0, [(0, "n0"), (3, "n6"), (1, "n2")]), V.SWAP),          # swap distance 2
])
def test_each_route_violation(bad, kind):
    found = kinds(sched([bad] + GOOD[1:]))
    if kind is None:
        assert not found - {V.STAGE_IMBALANCE}
    else:
        assert kind in found


def test_jump_and_no_swaps():
    s = sched([(0, [(0, "n0"), (3, "n6"), (2, "n4")])] + GOOD[1:])
    assert V.JUMP in kinds(s, max_jump=2)
    assert V.SWAP in kinds(s, allow_swaps=False)


def test_stage_imbalance():
    s = sched([(0, [(0, "n0"), (1, "n2"), (2, "n4")]), (1, [(0, "n1"), (1, "n3"), (2, "n5")]),
               (2, [(0, "n0"), (1, "n3"), (2, "n4")])])
    assert V.STAGE_IMBALANCE in kinds(s)
    assert V.STAGE_IMBALANCE not in kinds(s, stage_balance=False)


def test_memory_cap_in_order():
    order = (PeerOrder("n0", (OrderEntry(0, Phase.FORWARD), OrderEntry(2, Phase.FORWARD),
                              OrderEntry(0, Phase.FORWARD),            # head of 0: no new activation
                              OrderEntry(0, Phase.BACKWARD), OrderEntry(2, Phase.BACKWARD))),)
    assert V.MEMORY not in kinds(sched(GOOD, order=order))
    assert V.MEMORY in kinds(sched(GOOD, order=order), topo(memory=1))


def test_empty_stage_and_duplicates():
    stage_of = {**STAGE_OF, "n6": 2, "n7": 2}
    s = sched(GOOD + [(0, GOOD[0][1])], stage_of=stage_of)
    found = kinds(s)
    assert V.EMPTY_STAGE in found and V.DUPLICATE_MICROBATCH in found


def test_planned_schedule_validates_and_tampering_is_caught():
    t = topo()
    s = plan(t, PlanConfig(skip_ratio=0.25), 3)
    assert validate(s, t) == []
    r = s.routes[0]
    broken = dataclasses.replace(s, routes=(Route(r.microbatch_id, r.hops + r.hops[1:2]),) + s.routes[1:])
    assert {V.STAGE_REPEATED, V.PATH_LENGTH} <= {v.kind for v in validate(broken, t)}
