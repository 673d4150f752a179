"""Adverts cannot freeze planning (issue 24): an advert that contradicts the run spec or claims the
impossible is left out of the plan and logged once per peer; the honest peers are planned."""
import dataclasses
import logging

import pytest

from coordinator.advert_check import AdvertGate, advert_problem, ModelFacts
from coordinator.swarm_view import SwarmSnapshot, to_topology
from protocol.adverts import PeerAdvert, PeerState
from protocol.messages import RunSpec

SPEC = RunSpec(run="guard", model="tiny", num_stages=3, skip_ratio=0.0, seq_len=32)   # tiny: 6 layers, dim 64


def honest(peer: str) -> PeerAdvert:
    return PeerAdvert(peer_id=peer, state=PeerState.ONLINE, device="cpu", memory_free_bytes=2**30,
                      fwd_s_per_layer_sample=1e-3, memory_microbatches=4, num_layers=6,
                      activation_bytes_per_sample=32 * 64 * 4, param_bytes_per_layer=50_000,
                      stage0_extra_param_bytes=40_000)


LIES = {
    "seven_layers": dict(num_layers=7),
    "no_layers": dict(num_layers=0),
    "activation_size": dict(activation_bytes_per_sample=1),
    "nan_speed": dict(fwd_s_per_layer_sample=float("nan")),
    "inf_speed": dict(fwd_s_per_layer_sample=float("inf")),
    "absurd_speed": dict(fwd_s_per_layer_sample=1e9),
    "absurd_memory": dict(memory_free_bytes=1 << 62),
    "absurd_activation_memory": dict(memory_microbatches=1 << 40),
    "huge_parameters": dict(param_bytes_per_layer=1 << 50),
    "layers_outside_model": dict(stage=2, layer_start=4, layer_end=9),
}


@pytest.mark.parametrize("lie", LIES, ids=list(LIES))
def test_one_lying_advert_is_left_out_and_the_rest_is_planned(lie):
    adverts = {p: honest(p) for p in ("QmA", "QmB", "QmC")}
    adverts["QmLiar"] = dataclasses.replace(honest("QmLiar"), **LIES[lie])
    assert advert_problem(adverts["QmLiar"], SPEC, ModelFacts.of(SPEC)) is not None
    topology = to_topology(SwarmSnapshot(adverts, {}), SPEC, {})
    assert sorted(n.id for n in topology.nodes) == ["QmA", "QmB", "QmC"]
    assert topology.workload.num_layers == 6
    assert topology.workload.activation_bytes_per_sample == 32 * 64 * 4


def test_honest_adverts_pass():
    facts = ModelFacts.of(SPEC)
    assert facts.num_layers == 6
    assert advert_problem(honest("QmA"), SPEC, facts) is None
    assert advert_problem(dataclasses.replace(honest("QmA"), stage=1, layer_start=2, layer_end=4), SPEC, facts) is None


def test_majority_layer_count_wins_when_the_model_is_unknown():
    spec = dataclasses.replace(SPEC, model="not-a-preset")
    adverts = {p: honest(p) for p in ("QmA", "QmB")}
    adverts["QmLiar"] = dataclasses.replace(honest("QmLiar"), num_layers=7)
    assert sorted(n.id for n in to_topology(SwarmSnapshot(adverts, {}), spec, {}).nodes) == ["QmA", "QmB"]


def test_gate_logs_each_liar_once_not_every_round(caplog):
    gate = AdvertGate(SPEC)
    adverts = {"QmA": honest("QmA"), "QmLiar": dataclasses.replace(honest("QmLiar"), num_layers=7)}
    with caplog.at_level(logging.WARNING, logger="coordinator.advert_check"):
        for _ in range(5):
            assert list(gate.admit(adverts)) == ["QmA"]
    assert len([r for r in caplog.records if "QmLiar" in r.getMessage()]) == 1
    assert "7 layers" in gate.ignored["QmLiar"]
    adverts["QmLiar"] = dataclasses.replace(adverts["QmLiar"], num_layers=6)   # fixed: planned again
    assert sorted(gate.admit(adverts)) == ["QmA", "QmLiar"] and not gate.ignored


def test_a_peer_too_old_for_delayed_updates_is_left_out_of_a_delayed_run():
    # it would drop RunSpec.gradient_exchange, step synchronously and part from its replicas
    old = dataclasses.replace(honest("QmOld"), protocol_version=(1, 7))
    delayed = dataclasses.replace(SPEC, gradient_exchange="delayed")
    assert "1.8 or newer" in advert_problem(old, delayed, ModelFacts.of(delayed))
    assert advert_problem(old, SPEC, ModelFacts.of(SPEC)) is None          # a sync run takes it
    assert advert_problem(honest("QmNew"), delayed, ModelFacts.of(delayed)) is None
