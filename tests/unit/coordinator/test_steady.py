"""The iteration boundary and the steady-state prediction (coordinator/planner/steady.py), and
the swarm's fixed overheads in the cost model; hand-computed on 2-4 node topologies."""
import dataclasses

import pytest

from coordinator.planner import predict, simulate
from coordinator.planner.costs import CostModel, Overheads
from coordinator.planner.steady import boundary
from protocol.schedule import Hop, Route, Schedule, StageAssignment
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload

GIB = 2**30


def topo(fwd=(1.0, 2.0, 2.0), stages=2, lat_ms=100.0, bw=1.0, param=GIB, slow=None, delayed=False):
    """Node i: forward `fwd[i]` s per layer-sample; every link `lat_ms` and `bw` GiB/s except
    `slow` = ((a, b), GiB/s), both directions."""
    n = len(fwd)
    w = Workload(num_layers=stages, num_stages=stages, microbatch_samples=1, microbatches_per_data_node=1,
                 activation_bytes_per_sample=GIB, memory_microbatches=3, param_bytes_per_layer=param,
                 delayed_exchange=delayed)
    lat = tuple(tuple(0.0 if i == j else lat_ms for j in range(n)) for i in range(n))
    bws = [[bw] * n for _ in range(n)]
    if slow:
        (a, b), v = slow
        bws[a][b] = bws[b][a] = v
    nodes = tuple(Node(f"n{i}", f) for i, f in enumerate(fwd))
    return Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, tuple(map(tuple, bws))))


def sched(routes, stage_of):
    return Schedule("t", 0, "full", max(stage_of.values()) + 1, 0.0,
                    tuple(StageAssignment(p, s) for p, s in stage_of.items()),
                    tuple(Route(mb, tuple(Hop(s, p) for s, p in hops)) for mb, hops in routes))


# n0 stage 0 (the origin), n1 and n2 replicas of stage 1; one microbatch via n2. Cold iteration
# (tests/unit/coordinator/test_simulate.py): F0 [0,1], F1 [2.1,4.1], head [5.2,5.45], B1 [6.55,9.55], B0 [10.65,12.15].
REPLICATED = sched([(0, [(0, "n0"), (1, "n2")])], {"n0": 0, "n1": 1, "n2": 1})


def test_boundary_notice_exchange_and_no_exchange_without_replicas():
    t = topo()
    cost = CostModel(t)
    b = boundary(REPLICATED, simulate(REPLICATED, t, cost), cost, {})
    # the origin is done at its last backward; the others when its IterationDone arrives (+100 ms)
    assert b.done_s == pytest.approx({"n0": 12.15, "n1": 12.25, "n2": 12.25})
    # n2's share arrives: 1 GiB at 1 GiB/s + 100 ms (nobody waits for the ack of its own)
    assert b.exchanged_s["n1"] == pytest.approx(12.25 + 1.0 + 0.1)
    assert b.exchanged_s["n0"] == pytest.approx(12.15)       # stage 0 has one replica: nothing to exchange
    alone = sched([(0, [(0, "n0"), (1, "n1")])], {"n0": 0, "n1": 1})
    t2 = topo(fwd=(1.0, 2.0))
    b2 = boundary(alone, simulate(alone, t2), CostModel(t2), {})
    assert b2.exchanged_s == b2.done_s == b2.end_s


def test_more_replicas_over_slower_links_cost_more():
    three = sched([(0, [(0, "n0"), (1, "n2")])], {"n0": 0, "n1": 1, "n2": 1, "n3": 1})

    def exchange(t, s):
        cost = CostModel(t)
        b = boundary(s, simulate(s, t, cost), cost, {})
        return max(b.exchanged_s[p] - b.done_s[p] for p in b.done_s)

    two_fast = exchange(topo(), REPLICATED)
    two_slow = exchange(topo(bw=0.25), REPLICATED)
    three_one_slow_link = exchange(topo(fwd=(1.0, 2.0, 2.0, 2.0), slow=((1, 3), 0.1)), three)
    assert two_fast == pytest.approx(1.1)
    assert two_slow == pytest.approx(4.1) and two_slow > two_fast
    assert three_one_slow_link == pytest.approx(10.0 + 0.1) and three_one_slow_link > two_slow
    assert exchange(topo(param=0), REPLICATED) == 0.0        # no parameter size known: not modelled


def test_steady_state_a_late_replica_delays_the_next_iteration():
    # stage 1's exchange (4 GiB: 4.1 s) ends at 16.35, 4.2 s after the origin's end; the
    # next iteration's activation reaches n2 at 2.1 s, so F1 waits until 4.2: +2.1 s
    p = predict(REPLICATED, topo(param=4 * GIB))
    assert p.cold_s == pytest.approx(12.15)
    assert p.start_s["n2"] == pytest.approx(4.2)
    assert p.iteration_s == pytest.approx(12.15 + 2.1)
    # with 1 GiB the replicas are free again (1.2 s) before the activation arrives: no delay
    assert predict(REPLICATED, topo()).iteration_s == pytest.approx(12.15)


def test_delayed_updates_take_the_exchange_off_the_path_unless_it_outlasts_an_iteration():
    # the 4 GiB exchange (4.1 s) that delayed the next iteration by 2.1 s above now overlaps it
    t = topo(param=4 * GIB, delayed=True)
    p = predict(REPLICATED, t)
    assert p.iteration_s == pytest.approx(12.15) and p.start_s["n2"] == pytest.approx(0.1)   # the notice only
    assert p.boundary.exchanged_s == p.boundary.done_s        # nobody waits at its own boundary
    assert p.boundary.arrival_s["n1"] == pytest.approx(12.25 + 4.1)
    assert simulate(REPLICATED, t).iteration_time_s == pytest.approx(12.15)   # no exchange in the span
    # a 20 GiB exchange (20.1 s) outlasts the 12.15 s iteration: the replicas' step waits for
    # the shares of the iteration before, and the next iteration's F1 on n2 for that step
    slow = predict(REPLICATED, topo(param=20 * GIB, delayed=True))
    sync = predict(REPLICATED, topo(param=20 * GIB))
    assert 12.15 < slow.period_s < sync.period_s


def test_gaps_between_iterations():
    t = topo(param=4 * GIB)
    # the origin's own gap (progress report) gives the replicas time to catch up ...
    caught_up = predict(REPLICATED, t, CostModel(t, Overheads(origin_gap_s=3.0)))
    assert caught_up.iteration_s == pytest.approx(12.15)
    # ... the other peers' gap (schedule read) holds them back longer
    later = predict(REPLICATED, t, CostModel(t, Overheads(peer_gap_s=0.5)))
    assert later.iteration_s == pytest.approx(12.15 + 2.1 + 0.5)


def test_hop_and_task_overheads_in_the_cold_iteration():
    t = topo(fwd=(1.0, 2.0), param=0)
    s = sched([(0, [(0, "n0"), (1, "n1")])], {"n0": 0, "n1": 1})
    cost = CostModel(t, Overheads(hop_s=0.5, task_s=0.25))
    assert cost.transfer(0, 1) == pytest.approx(1.1 + 0.5) and cost.transfer(0, 0) == 0.0
    assert cost.fwd[1, 1] == pytest.approx(2.0 + 0.25) and cost.head[0] == pytest.approx(0.25 + 0.25)
    # 4 transfers and 5 tasks (F0, F1, head, B1, B0) on the one microbatch's chain
    assert simulate(s, t, cost).iteration_time_s == pytest.approx(12.15 + 4 * 0.5 + 5 * 0.25)
    assert simulate(s, t).iteration_time_s == pytest.approx(12.15)


def test_step_cost_and_bad_overheads():
    t = topo(param=400)
    cost = CostModel(t, Overheads(step_s_per_param=0.01))
    assert cost.step(1) == pytest.approx(0.01 * 100)            # 400 bytes = 100 float32 parameters
    b = boundary(REPLICATED, simulate(REPLICATED, t, cost), cost, {})
    assert b.end_s["n0"] - b.exchanged_s["n0"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="hop_s"):
        Overheads(hop_s=-1.0)
    assert dataclasses.replace(Overheads(), task_s=0.1).task_s == 0.1


def test_the_coordinator_plans_with_the_runs_exchange_mode():
    from coordinator.swarm_view import SwarmSnapshot, to_topology
    from tests.unit.coordinator.test_advert_check import SPEC, honest
    adverts = {p: honest(p) for p in ("QmA", "QmB", "QmC")}
    for mode in ("sync", "delayed"):
        topology = to_topology(SwarmSnapshot(adverts, {}), dataclasses.replace(SPEC, gradient_exchange=mode), {})
        assert topology.workload.delayed_exchange == (mode == "delayed")
        assert CostModel(topology).delayed_exchange == (mode == "delayed")
