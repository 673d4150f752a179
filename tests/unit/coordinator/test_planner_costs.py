import pytest

from coordinator.planner import PlanningError, path_length
from coordinator.planner.costs import CostModel
from coordinator.planner.rules import SeqState, sequence_problems, step
from coordinator.planner.config import PlannerConfig
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload


def two_nodes(param=0, sizes=()):
    w = Workload(num_layers=6, num_stages=2, microbatch_samples=4, microbatches_per_data_node=2,
                 activation_bytes_per_sample=2**20, memory_microbatches=3, stage_sizes=sizes,
                 backward_ratio=2.0, head_fraction=0.5, param_bytes_per_layer=param)
    nodes = (Node("a", 0.01), Node("b", 0.02, slowdown=2.0))
    links = Links(((0.0, 20.0), (20.0, 0.0)), ((1.0, 0.5), (0.5, 1.0)))
    return Topology(TOPOLOGY_FORMAT, w, nodes, links)


def test_compute_costs():
    c = CostModel(two_nodes(sizes=(2, 4)))
    assert c.fwd[0, 0] == pytest.approx(0.01 * 2 * 4)
    assert c.fwd[1, 1] == pytest.approx(0.02 * 2.0 * 4 * 4)
    assert c.bwd[1, 1] == pytest.approx(2.0 * c.fwd[1, 1])
    assert c.head[0] == pytest.approx(0.5 * 0.01 * 4)


def test_transfer_cost_is_latency_plus_bytes_over_bandwidth():
    c = CostModel(two_nodes())
    assert c.transfer(0, 1) == pytest.approx(0.020 + 4 * 2**20 / (0.5 * 2**30))
    assert c.transfer(0, 0) == 0.0
    assert c.transmission(1, 0) == pytest.approx(4 * 2**20 / (0.5 * 2**30))


def test_averaging_cost():
    c = CostModel(two_nodes(param=2**30))
    assert c.averaging(0, [0]) == 0.0
    # 3 layers per stage of 1 GiB each over 0.5 GiB/s, one-way latency 20 ms (no ack waited for)
    assert c.averaging(0, [0, 1]) == pytest.approx(3 * 2**30 / (0.5 * 2**30) + 0.020)
    assert CostModel(two_nodes()).averaging(0, [0, 1]) == 0.0


def test_stage_zero_shares_carry_the_embedding_and_head_too():
    import dataclasses
    topo = two_nodes(param=1000)
    topo = dataclasses.replace(topo, workload=dataclasses.replace(topo.workload, stage0_extra_param_bytes=500))
    c = CostModel(topo)
    assert c.stage_param_bytes(0) == 3 * 1000 + 500 and c.stage_param_bytes(1) == 3 * 1000
    assert c.share(0, 0, 1) - c.share(1, 0, 1) == pytest.approx(500 / (0.5 * 2**30))


@pytest.mark.parametrize("stages,k,expected", [(6, 1 / 3, 4), (6, 0.0, 6), (6, 0.5, 3), (4, 0.25, 3),
                                               (24, 0.25, 18), (3, 0.99, 1), (6, 2 / 3, 2),
                                               # however 1/3 is written, 4 of 6 (plain ceil gave 5 for 0.33)
                                               (6, 0.3333, 4), (6, 0.33, 4), (3, 0.33, 2), (6, 0.3, 5),
                                               (100, 0.0, 100), (100, 0.33, 67), (100, 1 / 3, 67)])
def test_path_length_guards_float_error(stages, k, expected):
    assert path_length(stages, k) == expected


@pytest.mark.parametrize("k", [-0.1, 1.0, 1.5])
def test_path_length_rejects_bad_k(k):
    with pytest.raises(PlanningError, match="outside"):
        path_length(6, k)


def test_rules_swap_and_jump():
    cfg = PlannerConfig()
    assert step(SeqState(), 5, {0}, cfg) is None                 # jump 5 > max_jump 4
    s = step(SeqState(), 3, {0}, cfg)
    assert step(s, 2, {0, 3}, cfg) == SeqState(3, 1, 1)          # adjacent swap
    assert step(s, 1, {0, 3}, cfg) is None                       # swap distance 2
    assert step(s, 2, {0, 3}, PlannerConfig(allow_swaps=False)) is None
    assert step(s, 3, {0, 3}, cfg) is None                       # repeat
    assert sequence_problems((0, 2, 1, 4, 3), cfg) == []
    assert [p for _, p in sequence_problems((0, 2, 1, 4, 3), PlannerConfig(max_swaps=1))][0].startswith("swap")
    assert sequence_problems((0, 5, 1), cfg)[0][1].startswith("jump")
