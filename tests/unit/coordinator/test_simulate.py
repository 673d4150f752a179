"""Hand-computed simulator cases (2-3 nodes, exact times)."""
import dataclasses

import pytest

from coordinator.planner import simulate
from coordinator.planner.costs import CostModel
from protocol.schedule import Hop, OrderEntry, PeerOrder, Phase, Route, Schedule, StageAssignment
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload

GIB = 2**30


def topo(fwd=(1.0, 2.0), stages=(0, 1), mb=1, memory=3, lat_ms=100.0, bw=1.0, param=0):
    n = len(fwd)
    w = Workload(num_layers=max(stages) + 1, num_stages=max(stages) + 1, microbatch_samples=1,
                 microbatches_per_data_node=mb, activation_bytes_per_sample=GIB, memory_microbatches=memory,
                 param_bytes_per_layer=param)
    nodes = tuple(Node(f"n{i}", f) for i, f in enumerate(fwd))
    lat = tuple(tuple(0.0 if i == j else lat_ms for j in range(n)) for i in range(n))
    bws = tuple(tuple(bw for _ in range(n)) for _ in range(n))
    return Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, bws))


def sched(routes, stage_of, order=()):
    return Schedule("t", 0, "skippipe", max(stage_of.values()) + 1, 0.0,
                    tuple(StageAssignment(p, s) for p, s in stage_of.items()),
                    tuple(Route(mb, tuple(Hop(s, p) for s, p in hops)) for mb, hops in routes), order)


def times(result, kind, mb, node=None):
    (iv,) = [i for i in result.intervals if i.kind == kind and i.microbatch_id == mb and (node is None or i.node == node)]
    return pytest.approx(iv.start), pytest.approx(iv.end)


def test_one_microbatch_two_nodes_exact():
    # F0 [0,1]; +1.1 transfer; F1 [2.1,4.1]; back 1.1; head [5.2,5.45]; B1 [6.55,9.55]; B0 [10.65,12.15]
    t = topo()
    r = simulate(sched([(0, [(0, "n0"), (1, "n1")])], {"n0": 0, "n1": 1}), t)
    assert times(r, "F", 0, "n0") == (0.0, 1.0)
    assert times(r, "F", 0, "n1") == (2.1, 4.1)
    assert times(r, "H", 0) == (5.2, 5.45)
    assert times(r, "B", 0, "n1") == (6.55, 9.55)
    assert times(r, "B", 0, "n0") == (10.65, 12.15)
    assert r.iteration_time_s == pytest.approx(12.15)
    assert r.busy_s["n0"] == pytest.approx(1.0 + 0.25 + 1.5)
    assert r.busy_fraction["n1"] == pytest.approx(5.0 / 12.15)


def test_two_microbatches_collide_on_second_node():
    t = topo(mb=2)
    routes = [(0, [(0, "n0"), (1, "n1")]), (1, [(0, "n0"), (1, "n1")])]
    r = simulate(sched(routes, {"n0": 0, "n1": 1}), t)
    assert times(r, "F", 1, "n0") == (1.0, 2.0)
    assert times(r, "F", 1, "n1") == (4.1, 6.1)        # arrived 3.1, waits for mb 0
    assert times(r, "H", 1) == (7.2, 7.45)
    assert times(r, "B", 0, "n1") == (6.55, 9.55)
    assert times(r, "B", 1, "n1") == (9.55, 12.55)
    assert r.iteration_time_s == pytest.approx(15.15)


def test_memory_limit_defers_forward():
    t = topo(mb=2, memory=1)
    routes = [(0, [(0, "n0"), (1, "n1")]), (1, [(0, "n0"), (1, "n1")])]
    r = simulate(sched(routes, {"n0": 0, "n1": 1}), t)
    assert times(r, "F", 1, "n0") == (12.15, 13.15)    # waits for B0 of microbatch 0
    assert r.iteration_time_s == pytest.approx(24.3)
    assert simulate(sched(routes, {"n0": 0, "n1": 1}), t, memory_limit=False).iteration_time_s == pytest.approx(15.15)


def test_link_contention_serialises_transfers():
    # transmission 1 s > n0's forward 0.5 s: the second activation queues behind the first
    t = topo(fwd=(0.5, 0.1), mb=2, lat_ms=100.0)
    routes = [(0, [(0, "n0"), (1, "n1")]), (1, [(0, "n0"), (1, "n1")])]
    s = sched(routes, {"n0": 0, "n1": 1})
    assert times(simulate(s, t), "F", 1, "n1")[0] == pytest.approx(2.6)
    assert times(simulate(s, t, link_contention=False), "F", 1, "n1")[0] == pytest.approx(2.1)


def test_order_ranks_ready_tasks_and_a_node_never_idles():
    # the peers' rule: n1's order lists microbatch 2, then 1, then 0; microbatch 0 arrives first
    # and runs at once (no idling for a listed task), then of the two waiting, 2 runs before 1
    t = topo(fwd=(1.0, 3.0), mb=3, memory=3)
    routes = [(m, [(0, "n0"), (1, "n1")]) for m in range(3)]
    order = (PeerOrder("n1", tuple(OrderEntry(m, Phase.FORWARD) for m in (2, 1, 0))
                       + tuple(OrderEntry(m, Phase.BACKWARD) for m in (2, 1, 0))),)
    r = simulate(sched(routes, {"n0": 0, "n1": 1}, order), t)
    assert times(r, "F", 0, "n1") == (2.1, 5.1)
    assert times(r, "F", 2, "n1") == (5.1, 8.1)                  # 1 and 2 arrived at 3.1 and 4.1
    assert times(r, "F", 1, "n1") == (8.1, 11.1)
    without_order = simulate(sched(routes, {"n0": 0, "n1": 1}), t)
    assert times(without_order, "F", 1, "n1") == (5.1, 8.1)      # first come first served


def test_three_nodes_skip_and_averaging():
    # n0 stage 0, n1 and n2 replicas of stage 1; 1 GiB params per layer over 1 GiB/s, 0.1 s one way
    t = topo(fwd=(1.0, 2.0, 2.0), stages=(0, 1), param=GIB)
    s = sched([(0, [(0, "n0"), (1, "n2")])], {"n0": 0, "n1": 1, "n2": 1})
    r = simulate(s, t)
    assert CostModel(t).averaging(1, [1, 2]) == pytest.approx(1.0 + 0.1)
    assert r.averaging_s == {0: 0.0, 1: pytest.approx(1.1)}
    assert r.stage_finish_s[1] == pytest.approx(9.55 + 1.1)
    assert r.iteration_time_s == pytest.approx(12.15)
    assert r.busy_s["n1"] == 0.0


def test_head_as_second_forward_in_origin_order():
    t = topo()
    order = (PeerOrder("n0", (OrderEntry(0, Phase.FORWARD), OrderEntry(0, Phase.FORWARD),
                              OrderEntry(0, Phase.BACKWARD))),)
    r = simulate(sched([(0, [(0, "n0"), (1, "n1")])], {"n0": 0, "n1": 1}, order), t)
    assert r.iteration_time_s == pytest.approx(12.15)


def test_a_later_listed_forward_never_takes_a_slot_the_order_counts_on():
    # n1 holds one activation; its order runs microbatch 1 first. Microbatch 0 arrives first but
    # may not start: the only slot is reserved for microbatch 1's forward, listed before it
    t = topo(mb=2)
    t = dataclasses.replace(t, nodes=(t.nodes[0], dataclasses.replace(t.nodes[1], memory_microbatches=1)))
    routes = [(m, [(0, "n0"), (1, "n1")]) for m in range(2)]
    order = (PeerOrder("n1", (OrderEntry(1, Phase.FORWARD), OrderEntry(1, Phase.BACKWARD),
                              OrderEntry(0, Phase.FORWARD), OrderEntry(0, Phase.BACKWARD))),)
    r = simulate(sched(routes, {"n0": 0, "n1": 1}, order), t)
    f1, b1, f0 = times(r, "F", 1, "n1"), times(r, "B", 1, "n1"), times(r, "F", 0, "n1")
    assert f1[0] == pytest.approx(3.1)                             # microbatch 1's arrival
    assert f0[0] == b1[1]                                           # after 1's backward freed the slot
    assert r.memory_overflows == 0
