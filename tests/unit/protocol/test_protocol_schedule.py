"""Schedule JSON files, constructor validation of the core records, and the DHT key builders."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ids
from protocol.adverts import STAGE_AUTO, LinkMeasurement, PeerAdvert, PeerState
from protocol.errors import DecodeError, FieldError
from protocol.messages import RunSpec, WorkHeader
from protocol.plain import to_plain
from protocol.schedule import (SCHEDULE_FORMAT, Hop, OrderEntry, PeerOrder, Phase, Route,
                               Schedule, StageAssignment, schedule_from_json, schedule_to_json)
from protocol.version import PROTOCOL_MAJOR


def sample() -> Schedule:
    return Schedule(
        run="demo-run", epoch=3, strategy="skippipe", num_stages=3, skip_ratio=1 / 3,
        assignment=(StageAssignment("a", 0), StageAssignment("b", 1), StageAssignment("c", 2)),
        routes=(Route(0, (Hop(0, "a"), Hop(1, "b"), Hop(2, "c"))), Route(1, (Hop(0, "a"), Hop(2, "c")))),
        order=(PeerOrder("a", (OrderEntry(0, Phase.FORWARD), OrderEntry(1, Phase.FORWARD),
                               OrderEntry(0, Phase.BACKWARD))),),
        predicted_iteration_s=1.25, seed=42)


# ---------------------------------------------------------------------------------------------
# JSON files
# ---------------------------------------------------------------------------------------------
def test_schedule_json_round_trip():
    s = sample()
    text = schedule_to_json(s)
    data = json.loads(text)
    assert data["format"] == SCHEDULE_FORMAT
    assert data["schedule"]["order"][0]["tasks"][2]["phase"] == int(Phase.BACKWARD)
    back = schedule_from_json(text)
    assert back == s
    assert back.order[0].tasks[2].phase is Phase.BACKWARD
    assert back.route(1).stages == (0, 2) and back.route(1).origin == "a"
    assert back.stage_of() == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(KeyError):
        back.route(99)


peers = st.sampled_from(["a", "b", "c", "peer-Qm123"])
hops = st.builds(Hop, stage=st.integers(0, 16), peer=peers)
schedules = st.builds(
    Schedule,
    run=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    epoch=st.integers(0, 2**62), strategy=st.sampled_from(["skippipe", "full", "random-skip"]),
    num_stages=st.integers(1, 16), skip_ratio=st.floats(0.0, 1.0, exclude_max=True),
    assignment=st.lists(st.builds(StageAssignment, peer=peers, stage=st.integers(0, 16)),
                        max_size=4).map(tuple),
    routes=st.lists(st.builds(Route, microbatch_id=st.integers(0, 1000),
                              hops=st.lists(hops, min_size=1, max_size=5).map(tuple)),
                    max_size=5).map(tuple),
    order=st.lists(st.builds(PeerOrder, peer=peers, tasks=st.lists(
        st.builds(OrderEntry, microbatch_id=st.integers(0, 1000), phase=st.sampled_from(Phase)),
        max_size=4).map(tuple)), max_size=3).map(tuple),
    predicted_iteration_s=st.floats(0, 1e6), seed=st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=150, deadline=None)
@given(schedules)
def test_random_schedules_round_trip(s):
    assert schedule_from_json(schedule_to_json(s)) == s


@pytest.mark.parametrize("text", [
    json.dumps({"format": "skippipe-schedule/2", "schedule": to_plain(sample())}),
    json.dumps({"schedule": to_plain(sample())}),
    json.dumps([SCHEDULE_FORMAT]),
    json.dumps(to_plain(sample())),
], ids=["other-version", "no-format", "not-an-object", "bare-schedule"])
def test_bad_format(text):
    with pytest.raises(FieldError) as info:
        schedule_from_json(text)
    assert info.value.field == "format"


@pytest.mark.parametrize("text", ["", "{", "schedule: 1", "[" * 100_000,
                                  '{"format": ' + "9" * 5000 + "}"],
                         ids=["empty", "truncated", "yaml", "deep", "huge-int"])
def test_not_json(text):
    with pytest.raises(FieldError) as info:
        schedule_from_json(text)
    assert info.value.field == "<file>"
    assert isinstance(info.value, DecodeError)


def _file_with(mutate) -> str:
    data = {"format": SCHEDULE_FORMAT, "schedule": to_plain(sample())}
    mutate(data["schedule"])
    return json.dumps(data)


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s.update(epoch=-1), "schedule.epoch"),
    (lambda s: s.update(epoch="3"), "schedule.epoch"),
    (lambda s: s.update(skip_ratio=1.0), "schedule.skip_ratio"),
    (lambda s: s.update(run="no spaces"), "schedule.run"),
    (lambda s: s["routes"][1].update(hops=[]), "schedule.routes[1].hops"),
    (lambda s: s["routes"][0]["hops"][2].update(stage=-1), "schedule.routes[0].hops[2].stage"),
    (lambda s: s["order"][0]["tasks"][1].update(phase=2), "schedule.order[0].tasks[1].phase"),
    (lambda s: s.pop("routes"), "schedule.routes"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_invalid_schedule_file_names_the_field(mutate, field):
    with pytest.raises(FieldError) as info:
        schedule_from_json(_file_with(mutate))
    assert info.value.field == field


def test_missing_schedule_body():
    with pytest.raises(FieldError):
        schedule_from_json(json.dumps({"format": SCHEDULE_FORMAT}))


# ---------------------------------------------------------------------------------------------
# __post_init__ validation
# ---------------------------------------------------------------------------------------------
def schedule(**changes) -> Schedule:
    fields = dict(run="r", epoch=0, strategy="full", num_stages=2, skip_ratio=0.0,
                  assignment=(), routes=())
    fields.update(changes)
    return Schedule(**fields)


@pytest.mark.parametrize("ratio", [-0.01, 1.0, 1.5, float("nan"), float("inf")])
def test_skip_ratio_must_lie_in_unit_interval(ratio):
    with pytest.raises(FieldError) as info:
        schedule(skip_ratio=ratio)
    assert info.value.field == "skip_ratio"
    with pytest.raises(FieldError) as info:
        RunSpec("r", "tiny", 2, ratio)
    assert info.value.field == "skip_ratio"


def test_skip_ratio_bounds_accepted():
    assert schedule(skip_ratio=0.0).skip_ratio == 0.0
    assert schedule(skip_ratio=0.999).skip_ratio == 0.999
    assert RunSpec("r", "tiny", 2, 0.5).skip_ratio == 0.5


def test_schedule_validation():
    with pytest.raises(FieldError) as info:
        schedule(epoch=-1)
    assert info.value.field == "epoch"
    with pytest.raises(FieldError) as info:
        schedule(num_stages=0)
    assert info.value.field == "num_stages"
    with pytest.raises(FieldError) as info:
        schedule(run="bad/run")
    assert info.value.field == "run"


def test_route_and_hop_validation():
    with pytest.raises(FieldError) as info:
        Route(0, ())
    assert info.value.field == "hops"
    with pytest.raises(FieldError) as info:
        Hop(-1, "a")
    assert info.value.field == "stage"
    r = Route(5, (Hop(0, "x"), Hop(3, "y")))
    assert r.origin == "x" and r.stages == (0, 3)


@pytest.mark.parametrize("changes,field", [
    (dict(run=""), "run"),
    (dict(run="has space"), "run"),
    (dict(run="x" * 65), "run"),
    (dict(run="-leading-dash"), "run"),
    (dict(run="trailing-newline\n"), "run"),
    (dict(run="a/b"), "run"),
    (dict(num_stages=0), "num_stages"),
    (dict(microbatch_samples=0), "microbatch_samples"),
    (dict(seq_len=0), "seq_len"),
    (dict(microbatches_per_origin=0), "microbatches_per_origin"),
    (dict(stage_sizes=(1, 2, 3)), "stage_sizes"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_run_spec_validation(changes, field):
    fields = dict(run="run-1", model="tiny", num_stages=2, skip_ratio=0.25)
    fields.update(changes)
    with pytest.raises(FieldError) as info:
        RunSpec(**fields)
    assert info.value.field == field


def test_run_spec_defaults():
    spec = RunSpec("run-1", "tiny", 2, 0.25, stage_sizes=(3, 1))
    assert spec.stage_sizes == (3, 1) and spec.seed == 0 and spec.microbatch_samples >= 1


def test_work_header_validation():
    assert WorkHeader("run", 0, 0, 0, 0).hop_index == 0
    for name in ("epoch", "iteration", "microbatch_id", "hop_index"):
        fields = dict(run="run", epoch=0, iteration=0, microbatch_id=0, hop_index=0)
        fields[name] = -1
        with pytest.raises(FieldError) as info:
            WorkHeader(**fields)
        assert info.value.field == name


@pytest.mark.parametrize("changes,field", [
    (dict(memory_free_bytes=-1), "memory_free_bytes"),
    (dict(fwd_s_per_layer_sample=-0.1), "fwd_s_per_layer_sample"),
    (dict(stage=-2), "stage"),
    (dict(layer_start=4, layer_end=2), "layer_end"),
    (dict(layer_start=-1), "layer_end"),
    (dict(memory_microbatches=0), "memory_microbatches"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_peer_advert_validation(changes, field):
    fields = dict(peer_id="p", state=PeerState.ONLINE, device="cpu", memory_free_bytes=0,
                  fwd_s_per_layer_sample=0.0)
    fields.update(changes)
    with pytest.raises(FieldError) as info:
        PeerAdvert(**fields)
    assert info.value.field == field


def test_peer_advert_defaults():
    advert = PeerAdvert("p", PeerState.JOINING, "cpu", 0, 0.0)
    assert advert.stage == STAGE_AUTO == -1
    assert advert.protocol_version[0] == PROTOCOL_MAJOR
    assert PeerAdvert("p", PeerState.ONLINE, "cpu", 1, 1.0, stage=0, layer_start=2, layer_end=2).stage == 0


def test_link_measurement_validation():
    with pytest.raises(FieldError) as info:
        LinkMeasurement("b", -1.0, 1.0)
    assert info.value.field == "rtt_ms"
    for bw in (0.0, -5.0):
        with pytest.raises(FieldError) as info:
            LinkMeasurement("b", 1.0, bw)
        assert info.value.field == "bandwidth_bytes_s"


# ---------------------------------------------------------------------------------------------
# DHT keys
# ---------------------------------------------------------------------------------------------
KEY_BUILDERS = [ids.spec_key, ids.peers_key, ids.links_key, ids.schedule_key, ids.progress_key]


@pytest.mark.parametrize("builder", KEY_BUILDERS, ids=lambda f: f.__name__)
def test_dht_keys_embed_major_version_and_run(builder):
    key = builder("my-run_1.2")
    parts = key.split("/")
    assert parts[:3] == ["skippipe", f"v{PROTOCOL_MAJOR}", "my-run_1.2"]
    assert parts[3] == builder.__name__.removesuffix("_key")
    assert builder("other") != key


def test_dht_keys_are_distinct():
    assert len({b("r") for b in KEY_BUILDERS}) == len(KEY_BUILDERS)


@pytest.mark.parametrize("builder", KEY_BUILDERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("run", ["", "a/b", "a b", "x" * 65, ".hidden", "run\n", "\nrun", "ünï",
                                 None, 5, b"run"], ids=repr)
def test_dht_keys_reject_bad_run_names(builder, run):
    with pytest.raises(FieldError) as info:
        builder(run)
    assert info.value.field == "run"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=70))
def test_run_name_rule(name):
    ok = (1 <= len(name) <= 64 and name[0].isascii() and name[0].isalnum()
          and all(c.isascii() and (c.isalnum() or c in "_.-") for c in name))
    if ok:
        assert ids.check_run_name(name) == name
        assert ids.spec_key(name).split("/")[2] == name
    else:
        with pytest.raises(FieldError):
            ids.check_run_name(name)
