"""The `skippipe-topology/1` JSON schema: valid files round-trip, every invalid one raises a
TopologyError whose `.field` names the offending JSON path."""
from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError, TopologyError
from protocol.topology import (TOPOLOGY_FORMAT, Topology, load_topology, parse_topology,
                               topology_to_json)


def valid() -> dict:
    return {
        "format": TOPOLOGY_FORMAT,
        "workload": {
            "num_layers": 6, "num_stages": 3, "microbatch_samples": 4,
            "microbatches_per_data_node": 2, "activation_bytes_per_sample": 4096,
            "memory_microbatches": 3, "stage_sizes": [2, 3, 1], "backward_ratio": 2.0,
        },
        "nodes": [
            {"id": "a", "fwd_s_per_layer_sample": 0.01, "location": "eu"},
            {"id": "b", "fwd_s_per_layer_sample": 0.02, "memory_microbatches": 5, "stage": 1},
            {"id": "c", "fwd_s_per_layer_sample": 0.015, "slowdown": 2.5, "stage": -1},
        ],
        "links": {
            "latency_ms": [[0, 10, 20], [10, 0, 5.5], [20, 5.5, 0]],
            "bandwidth_gib_s": [[0, 1, 0.5], [1, 0, 2], [0.5, 2, 0]],
        },
    }


def test_valid_topology_parses():
    t = parse_topology(valid())
    assert isinstance(t, Topology)
    assert t.node_ids == ("a", "b", "c")
    assert t.workload.layers_per_stage() == (2, 3, 1)
    assert t.workload.head_fraction == 0.25 and t.workload.param_bytes_per_layer == 0  # defaults
    assert t.nodes[0].memory(t.workload) == 3 and t.nodes[1].memory(t.workload) == 5
    assert t.nodes[1].stage == 1 and t.nodes[0].stage == -1
    assert t.latency_s(0, 1) == pytest.approx(0.010) and t.latency_s(2, 2) == 0.0
    assert t.bandwidth_bytes_s(1, 2) == 2 * 2**30 and t.bandwidth_bytes_s(1, 1) == math.inf
    assert isinstance(t.links.latency_ms[1][2], float)


def test_even_split_when_stage_sizes_omitted():
    data = valid()
    del data["workload"]["stage_sizes"]
    data["workload"]["num_layers"] = 8
    assert parse_topology(data).workload.layers_per_stage() == (2, 3, 3)  # extra layers go last


def test_round_trip_via_json(tmp_path):
    t = parse_topology(valid())
    text = topology_to_json(t)
    assert json.loads(text)["format"] == TOPOLOGY_FORMAT
    assert parse_topology(json.loads(text)) == t
    path = tmp_path / "topo.json"
    path.write_text(text)
    assert load_topology(path) == t
    assert load_topology(str(path)) == t
    assert topology_to_json(load_topology(path)) == text


def test_unknown_fields_are_ignored():
    data = valid()
    data["comment"] = "made by hand"
    data["nodes"][0]["gpu"] = "H200"
    assert parse_topology(data) == parse_topology(valid())


@st.composite
def topologies(draw):
    n = draw(st.integers(1, 5))
    num_layers = draw(st.integers(1, 12))
    num_stages = draw(st.integers(1, num_layers))
    pos = st.floats(min_value=1e-6, max_value=1e6)
    nonneg = st.floats(min_value=0, max_value=1e6)
    return {
        "format": TOPOLOGY_FORMAT,
        "workload": {"num_layers": num_layers, "num_stages": num_stages,
                     "microbatch_samples": draw(st.integers(1, 64)),
                     "microbatches_per_data_node": draw(st.integers(1, 16)),
                     "activation_bytes_per_sample": draw(st.integers(0, 2**40)),
                     "memory_microbatches": draw(st.integers(1, 16)),
                     "backward_ratio": draw(pos), "head_fraction": draw(nonneg)},
        "nodes": [{"id": f"n{i}", "fwd_s_per_layer_sample": draw(pos),
                   "stage": draw(st.integers(-1, num_stages - 1)), "slowdown": draw(pos)}
                  for i in range(n)],
        "links": {"latency_ms": [[draw(nonneg) for _ in range(n)] for _ in range(n)],
                  "bandwidth_gib_s": [[draw(pos) for _ in range(n)] for _ in range(n)]},
    }


@settings(max_examples=100, deadline=None)
@given(topologies())
def test_random_valid_topologies_round_trip(data):
    t = parse_topology(data)
    assert parse_topology(json.loads(topology_to_json(t))) == t
    assert sum(t.workload.layers_per_stage()) == t.workload.num_layers
    assert len(t.workload.layers_per_stage()) == t.workload.num_stages


DELETE = object()


def mutate(path, value):
    data = copy.deepcopy(valid())
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


BAD = [
    # (path, value, expected .field)
    (("format",), "skippipe-topology/2", "format"),
    (("format",), "", "format"),
    (("format",), 1, "format"),
    (("format",), DELETE, "format"),
    (("links", "latency_ms"), [[0, 1, 2], [1, 0, 3]], "links.latency_ms"),             # 2 rows
    (("links", "latency_ms", 1), [10, 0], "links.latency_ms[1]"),                      # short row
    (("links", "bandwidth_gib_s", 2), [0.5, 2, 0, 1], "links.bandwidth_gib_s[2]"),     # long row
    (("links", "latency_ms", 0, 2), -1, "links.latency_ms[0][2]"),
    (("links", "latency_ms", 0, 2), "20", "links.latency_ms[0][2]"),
    (("links", "latency_ms", 0, 2), float("nan"), "links.latency_ms[0][2]"),
    (("links", "latency_ms", 0, 2), float("inf"), "links.latency_ms[0][2]"),
    (("links", "bandwidth_gib_s", 1, 0), 0, "links.bandwidth_gib_s[1][0]"),
    (("links", "bandwidth_gib_s", 1, 0), -2, "links.bandwidth_gib_s[1][0]"),
    (("links", "bandwidth_gib_s", 1, 0), 10**400, "links.bandwidth_gib_s[1][0]"),      # overflows float
    (("links", "bandwidth_gib_s"), DELETE, "links.bandwidth_gib_s"),
    (("links",), DELETE, "links"),
    (("nodes", 1, "fwd_s_per_layer_sample"), -0.5, "nodes[1].fwd_s_per_layer_sample"),
    (("nodes", 1, "fwd_s_per_layer_sample"), 0, "nodes[1].fwd_s_per_layer_sample"),
    (("nodes", 1, "fwd_s_per_layer_sample"), True, "nodes[1].fwd_s_per_layer_sample"),
    (("nodes", 1, "fwd_s_per_layer_sample"), DELETE, "nodes[1].fwd_s_per_layer_sample"),
    (("nodes", 2, "slowdown"), 0, "nodes[2].slowdown"),
    (("nodes", 2, "memory_microbatches"), -1, "nodes[2].memory_microbatches"),
    (("nodes", 0, "stage"), 3, "nodes[0].stage"),                                      # only 3 stages
    (("nodes", 0, "stage"), -2, "nodes[0].stage"),
    (("nodes", 0, "id"), "", "nodes[0].id"),
    (("nodes", 0, "id"), 7, "nodes[0].id"),
    (("nodes", 0, "id"), DELETE, "nodes[0].id"),
    (("nodes", 2, "id"), "a", "nodes"),                                                # duplicate id
    (("nodes",), [], "nodes"),
    (("nodes",), {"a": {}}, "nodes"),
    (("nodes", 1), "b", "nodes[1]"),
    (("workload", "stage_sizes"), [3, 3], "workload.stage_sizes"),                     # wrong length
    (("workload", "stage_sizes"), [2, 2, 1], "workload.stage_sizes"),                  # sums to 5
    (("workload", "stage_sizes"), [3, 3, 0], "workload.stage_sizes"),
    (("workload", "stage_sizes"), [2, 3.0, 1], "workload.stage_sizes[1]"),
    (("workload", "num_stages"), 7, "workload.num_stages"),                            # > num_layers
    (("workload", "num_stages"), 0, "workload.num_stages"),
    (("workload", "num_layers"), "6", "workload.num_layers"),
    (("workload", "num_layers"), 6.0, "workload.num_layers"),
    (("workload", "num_layers"), DELETE, "workload.num_layers"),
    (("workload", "microbatch_samples"), 0, "workload.microbatch_samples"),
    (("workload", "activation_bytes_per_sample"), -1, "workload.activation_bytes_per_sample"),
    (("workload", "backward_ratio"), 0, "workload.backward_ratio"),
    (("workload",), DELETE, "workload"),
    (("workload",), [6, 3], "workload"),
]


@pytest.mark.parametrize("path,value,field", BAD, ids=[f"{c[2]}={c[1]!r:.10}" for c in BAD])
def test_bad_topology_names_the_field(path, value, field):
    with pytest.raises(TopologyError) as info:
        parse_topology(mutate(path, value))
    assert info.value.field == field
    assert repr(field) in str(info.value)
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize("data", [None, [], "topology", 3], ids=repr)
def test_root_must_be_an_object(data):
    with pytest.raises(TopologyError):
        parse_topology(data)


def test_non_json_file(tmp_path):
    path = tmp_path / "topo.json"
    path.write_text("format: skippipe-topology/1\n")
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.field == "<file>" and str(path) in str(info.value)


@pytest.mark.parametrize("content", [
    b"",
    b"\xff\xfe\x00garbage",                        # not UTF-8
    b"[" * 100_000,                                # nesting deeper than the JSON parser allows
    b'{"format": ' + b"1" * 5000 + b"}",            # integer over Python's digit limit
], ids=["empty", "not-utf8", "deep", "huge-int"])
def test_unreadable_json_files(tmp_path, content):
    path = tmp_path / "topo.json"
    path.write_bytes(content)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.field == "<file>"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.field == "<file>" and str(path) in str(info.value)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_topology(tmp_path)
    assert info.value.field == "<file>"


def test_invalid_content_in_file_names_the_field(tmp_path):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(mutate(("links", "latency_ms", 0, 1), -3)))
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.field == "links.latency_ms[0][1]"
