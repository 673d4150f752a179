"""Relayed peers in the planner (coordinator/planner/relayed.py, issue 28)."""
import collections
import random

import pytest

from coordinator.planner import PlanConfig, plan, validate
from coordinator.planner.presets import make_topology
from coordinator.planner.relayed import BANDWIDTH_DIVISOR, EXTRA_LATENCY_MS, penalise_relayed, relayed_ids


def topo(seed: int):
    return make_topology("geo", 12, random.Random(seed), stages=4, layers=8)


def test_only_links_with_a_relayed_end_get_dearer_and_only_once():
    t = topo(1)
    a, b, c = (n.id for n in t.nodes[:3])
    p = penalise_relayed(t, {a, b})
    lat, bw, lat0, bw0 = p.links.latency_ms, p.links.bandwidth_gib_s, t.links.latency_ms, t.links.bandwidth_gib_s
    assert lat[0][1] == pytest.approx(lat0[0][1] + EXTRA_LATENCY_MS)          # both ends relayed: one hop
    assert bw[0][1] == pytest.approx(bw0[0][1] / BANDWIDTH_DIVISOR)
    assert lat[2][0] == pytest.approx(lat0[2][0] + EXTRA_LATENCY_MS) and bw[0][2] < bw0[0][2]
    assert lat[2][3] == lat0[2][3] and bw[2][3] == bw0[2][3]                  # c-d: nobody relayed
    assert lat[0][0] == lat0[0][0] and p.nodes == t.nodes and p.workload == t.workload
    assert penalise_relayed(t, {"someone-else"}) is t
    with pytest.raises(ValueError):
        penalise_relayed(t, {a}, bandwidth_divisor=0.5)


def test_relayed_peers_come_from_the_self_test_or_from_circuit_only_addresses():
    circuit = "/ip4/1.2.3.4/tcp/1/p2p/QmR/p2p-circuit/p2p/QmA"
    got = relayed_ids({"a": "relayed", "b": "public", "c": ""},
                      {"b": ("/ip4/1.2.3.4/tcp/5",), "c": (circuit,), "d": (circuit, "/ip4/5.6.7.8/tcp/9"), "e": ()})
    assert got == {"a", "c"}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_planner_routes_less_through_relayed_peers(seed):
    t = topo(seed)
    relayed = {n.id for n in t.nodes[:3]}

    def load(schedule):
        hops = collections.Counter(h.peer for r in schedule.routes for h in r.hops)
        return sum(hops[p] for p in relayed)
    plain = plan(t, PlanConfig(skip_ratio=0.25), 1)
    aware = plan(penalise_relayed(t, relayed), PlanConfig(skip_ratio=0.25), 1)
    assert validate(aware, t) == []           # still a valid schedule for the real swarm
    assert load(aware) < load(plain) / 2, (load(aware), load(plain))


def test_the_coordinators_topology_makes_a_relayed_peers_links_dearer():
    from dataclasses import replace

    from coordinator.swarm_view import SwarmSnapshot, to_topology
    from protocol.adverts import PeerAdvert, PeerState
    from protocol.messages import RunSpec
    from coordinator.advert_check import ModelFacts
    peers = ["QmA", "QmB", "QmC"]
    spec = RunSpec(run="r", model="tiny", num_stages=3, skip_ratio=1 / 3, microbatch_samples=2)
    activation = ModelFacts.of(spec).activation_bytes_per_sample       # what an honest advert says
    adverts = {p: PeerAdvert(peer_id=p, state=PeerState.ONLINE, device="cpu", memory_free_bytes=2**30,
                             fwd_s_per_layer_sample=1e-3, num_layers=6, reachability="public",
                             activation_bytes_per_sample=activation, param_bytes_per_layer=10_000,
                             memory_microbatches=4) for p in peers}
    before = to_topology(SwarmSnapshot(adverts, {}), spec, {})
    adverts["QmC"] = replace(adverts["QmC"], reachability="relayed")
    after = to_topology(SwarmSnapshot(adverts, {}), spec, {})
    assert after.links.bandwidth_gib_s[0][2] == pytest.approx(before.links.bandwidth_gib_s[0][2] / BANDWIDTH_DIVISOR)
    assert after.links.latency_ms[2][1] > before.links.latency_ms[2][1]
    assert after.links.latency_ms[0][1] == before.links.latency_ms[0][1]
