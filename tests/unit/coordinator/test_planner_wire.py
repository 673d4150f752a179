"""The planner's wire compression (issue 27): quantised links priced in the cost model and the
simulator, auto choosing per link, and the schedule carrying the choice (Schedule.wire)."""
import dataclasses
import random

import pytest

from coordinator.planner import PlanningError, plan
from coordinator.planner.config import PlanConfig, PlannerConfig
from coordinator.planner.costs import (LOCAL_SWARM_OVERHEADS, CostModel, choose_codecs, codec_seconds,
                                       _auto_codec, schedule_codecs, wire_bytes_per_element)
from coordinator.planner.presets import make_topology
from coordinator.planner.simulate import simulate
from coordinator.planner.steady import predict
from protocol.quantised import bytes_per_element
from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload

BYTES = 4 * 2**20      # one microbatch's float32 activation below


def three_nodes():
    """a-b fast (2 GiB/s), c far from both (5 MiB/s): c's links dominate, a-b's do not."""
    w = Workload(num_layers=6, num_stages=3, microbatch_samples=4, microbatches_per_data_node=2,
                 activation_bytes_per_sample=2**20, memory_microbatches=3)
    nodes = (Node("a", 0.001), Node("b", 0.001), Node("c", 0.001))
    slow = 5 / 1024
    bw = ((1.0, 2.0, slow), (2.0, 1.0, slow), (slow, slow, 1.0))
    lat = ((0.0, 1.0, 50.0), (1.0, 0.0, 50.0), (50.0, 50.0, 0.0))
    return Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, bw))


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_a_quantised_link_carries_fewer_bytes_and_pays_the_codec(codec):
    topo = three_nodes()
    floats, packed = CostModel(topo), CostModel(topo, wire=codec)
    bw = 5 / 1024 * 2**30
    assert floats.transmission(0, 2) == pytest.approx(BYTES / bw)
    per_element = wire_bytes_per_element(codec)     # int4: activations' min/max and gradients' absmax blocks
    assert per_element == (bytes_per_element(codec) if codec == "int8"
                           else (bytes_per_element(codec) + bytes_per_element(codec, offsets=True)) / 2)
    assert packed.transmission(0, 2) == pytest.approx(BYTES * per_element / 4 / bw)
    assert packed.transfer(0, 2) == pytest.approx(0.050 + BYTES * per_element / 4 / bw
                                                  + codec_seconds(BYTES))
    assert packed.transfer(0, 0) == 0.0 and packed.codec[1][1] == "off"


def test_auto_compresses_where_transmission_dominates_and_not_on_fast_links():
    c = CostModel(three_nodes(), wire="auto")
    assert c.codec[0][2] == c.codec[2][1] == "int4"     # even int8 would take 26x a stage's forward
    assert c.codec[0][1] == c.codec[1][0] == "off"
    assert CostModel(three_nodes(), wire="off").codec == [["off"] * 3] * 3
    with pytest.raises(ValueError):
        choose_codecs("int2", 1.0, c.bandwidth, c.fwd.mean(axis=1))
    with pytest.raises(PlanningError):
        PlanConfig(wire_compression="zip")


def test_auto_goes_to_int4_only_where_int8_still_leaves_transmission_dominant():
    int8_s = wire_bytes_per_element("int8") / 4           # of a 1 s float transmission
    assert _auto_codec(1.0, 0.01, dominant_s=2.0) == "off"
    assert _auto_codec(1.0, 0.01, dominant_s=int8_s * 1.1) == "int8"
    assert _auto_codec(1.0, 0.01, dominant_s=int8_s * 0.9) == "int4"
    assert _auto_codec(1.0, 0.9, dominant_s=0.0) == "off"          # the codec's time outweighs the bytes saved


def geo():
    """bench/swarm_vs_full.py's emulated geo topology (smaller: 8 nodes, 4 stages)."""
    topo = make_topology("geo", 8, random.Random(2), stages=4, layers=4, microbatch_samples=4, microbatches=4,
                         activation_bytes=64 * 64 * 4, memory=8)
    bw = tuple(tuple(v * 0.02 for v in row) for row in topo.links.bandwidth_gib_s)
    nodes = tuple(dataclasses.replace(n, fwd_s_per_layer_sample=3e-4) for n in topo.nodes)
    return dataclasses.replace(topo, nodes=nodes, links=dataclasses.replace(topo.links, bandwidth_gib_s=bw))


def test_auto_plans_a_faster_schedule_that_names_its_quantised_links():
    topo, quick = geo(), PlannerConfig(partitions=4, restarts=0, finalists=1)
    off = plan(topo, PlanConfig("skippipe", 1 / 3, quick, overheads=LOCAL_SWARM_OVERHEADS), 0)
    auto = plan(topo, PlanConfig("skippipe", 1 / 3, quick, overheads=LOCAL_SWARM_OVERHEADS,
                                 wire_compression="auto"), 0)
    assert off.wire == () and auto.wire
    assert auto.predicted_iteration_s < 0.9 * off.predicted_iteration_s
    used = set()
    for r in auto.routes:
        peers = [h.peer for h in r.hops] + [r.origin]
        used |= {frozenset(p) for p in zip(peers, peers[1:])}
    links = schedule_codecs(auto)
    assert all(frozenset(k) in used and (k[1], k[0]) in links for k in links)   # both directions, used links only
    # the simulator prices the schedule's own links when no cost model is given
    assert predict(auto, topo, CostModel(topo, LOCAL_SWARM_OVERHEADS, links)).iteration_s == \
        pytest.approx(auto.predicted_iteration_s)
    floats = simulate(dataclasses.replace(auto, wire=()), topo).iteration_time_s
    assert simulate(auto, topo).iteration_time_s < floats
