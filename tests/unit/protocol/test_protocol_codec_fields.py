"""The msgpack envelope codec: wrong-typed and invalid fields give a FieldError naming the
field; mutated frames raise only ProtocolErrors; the exception tree and its wire codes."""
from __future__ import annotations

import copy

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol import messages as m
from protocol.adverts import LinkMeasurement, LinkReport, PeerAdvert
from protocol.errors import (DecodeError, ErrorCode, FieldError, MessageTooLarge, ProtocolError, TensorError,
                             TopologyError, UnknownMessageType, VersionMismatch)
from protocol.plain import to_plain
from protocol.schedule import Schedule
from protocol.tensors import TensorChunk
from protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR
from tests.unit.protocol.codec_support import SAMPLES, any_message, assert_only_protocol_errors, code, frame


# ---------------------------------------------------------------------------------------------
# Wrong-typed and invalid fields: FieldError naming the field path
# ---------------------------------------------------------------------------------------------
def _set(plain, path, value):
    """Set (or with value=DELETE, delete) plain[path...] on a deep copy."""
    plain = copy.deepcopy(plain)
    target = plain
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return plain


DELETE = object()
NAN, INF = float("nan"), float("inf")
SPEC = m.RunSpec("run", "tiny", 2, 0.5)
FWD = SAMPLES[2]
SCHED = SAMPLES[3]
ADVERT = SAMPLES[4]
REPORT = LinkReport("a", (LinkMeasurement("b", 1.0, 1e6),))
TIMED = m.IterationReport("a", 1, 2, 1.0, 2, 16, 0.0, 1.0, m.MicrobatchCounts(completed=2),
                          timed_microbatches=(0, 1), round_trip_s=(0.5, 0.7))

BAD_FIELDS = [
    # (message, path into the plain body, bad value, expected FieldError.field)
    (m.Ping(1), ("nonce",), "1", "nonce"),
    (m.Ping(1), ("nonce",), True, "nonce"),
    (m.Ping(1), ("nonce",), 1.0, "nonce"),
    (m.Ping(1), ("nonce",), None, "nonce"),
    (m.Ping(1), ("nonce",), DELETE, "nonce"),
    (m.Ping(1), ("payload",), "text", "payload"),
    (m.Ping(1), ("payload",), [1, 2], "payload"),
    (SPEC, ("skip_ratio",), NAN, "skip_ratio"),
    (SPEC, ("skip_ratio",), INF, "skip_ratio"),
    (SPEC, ("skip_ratio",), -INF, "skip_ratio"),
    (SPEC, ("skip_ratio",), True, "skip_ratio"),
    (SPEC, ("skip_ratio",), "0.5", "skip_ratio"),
    (SPEC, ("skip_ratio",), 1, "skip_ratio"),           # int accepted as number, but out of range
    (SPEC, ("skip_ratio",), -0.1, "skip_ratio"),
    (SPEC, ("learning_rate",), NAN, "learning_rate"),
    (SPEC, ("learning_rate",), -0.01, "learning_rate"),     # forged in a red-team run: trains away from the data
    (SPEC, ("learning_rate",), 0.0, "learning_rate"),
    (SPEC, ("learning_rate",), 5.0, "learning_rate"),
    (SPEC, ("max_grad_norm",), 0.0, "max_grad_norm"),       # clipping off
    (SPEC, ("max_grad_norm",), INF, "max_grad_norm"),
    (SPEC, ("warmup_steps",), -1, "warmup_steps"),
    (SPEC, ("max_steps",), -5, "max_steps"),
    (SPEC, ("gradient_exchange",), "async", "gradient_exchange"),   # replicas would disagree on when to step
    (SPEC, ("gradient_exchange",), 1, "gradient_exchange"),
    (SPEC, ("num_stages",), 0, "num_stages"),
    (SPEC, ("num_stages",), False, "num_stages"),
    (SPEC, ("run",), "bad run", "run"),
    (SPEC, ("run",), "", "run"),
    (SPEC, ("run",), 5, "run"),
    (SPEC, ("stage_sizes",), [1, 2, 3], "stage_sizes"),
    (SPEC, ("stage_sizes",), [1, "2"], "stage_sizes[1]"),
    (SPEC, ("stage_sizes",), "12", "stage_sizes"),
    (SPEC, ("model",), DELETE, "model"),
    (FWD, ("header",), "header", "header"),
    (FWD, ("header", "epoch"), "3", "header.epoch"),
    (FWD, ("header", "epoch"), -1, "header.epoch"),
    (FWD, ("header", "run"), "a/b", "header.run"),
    (FWD, ("header", "hop_index"), DELETE, "header.hop_index"),
    (FWD, ("tensor",), None, "tensor"),
    (FWD, ("tensor", "shape", 1), "3", "tensor.shape[1]"),
    (FWD, ("tensor", "shape", 1), -3, "tensor.shape"),
    (FWD, ("tensor", "dtype"), "complex128", "tensor.dtype"),
    (FWD, ("tensor", "data"), bytes(11), "tensor.data"),
    (FWD, ("tensor", "data"), "x" * 12, "tensor.data"),
    (SCHED, ("epoch",), -1, "epoch"),
    (SCHED, ("routes", 0, "hops"), [], "routes[0].hops"),
    (SCHED, ("routes", 0, "hops", 1, "stage"), -1, "routes[0].hops[1].stage"),
    (SCHED, ("routes", 0, "hops", 1, "stage"), "1", "routes[0].hops[1].stage"),
    (SCHED, ("routes", 0, "hops", 1, "peer"), 7, "routes[0].hops[1].peer"),
    (SCHED, ("routes", 0, "hops", 1), ["b", 1], "routes[0].hops[1]"),
    (SCHED, ("order", 0, "tasks", 0, "phase"), 7, "order[0].tasks[0].phase"),
    (SCHED, ("order", 0, "tasks", 0, "phase"), "FORWARD", "order[0].tasks[0].phase"),
    (SCHED, ("assignment", 1, "stage"), 1.5, "assignment[1].stage"),
    (SCHED, ("assignment",), {"a": 0}, "assignment"),
    (ADVERT, ("state",), "ONLINE", "state"),
    (ADVERT, ("state",), 99, "state"),
    (ADVERT, ("protocol_version",), [1], "protocol_version"),
    (ADVERT, ("protocol_version",), [1, "0"], "protocol_version[1]"),
    (ADVERT, ("maddrs",), [b"/ip4"], "maddrs[0]"),
    (ADVERT, ("memory_free_bytes",), -1, "memory_free_bytes"),
    (ADVERT, ("stage",), -2, "stage"),
    (ADVERT, ("fwd_s_per_layer_sample",), INF, "fwd_s_per_layer_sample"),
    (ADVERT, ("measured_fwd_s_per_layer_sample",), NAN, "measured_fwd_s_per_layer_sample"),
    (ADVERT, ("measured_fwd_s_per_layer_sample",), -1.0, "measured_fwd_s_per_layer_sample"),
    (ADVERT, ("late_peers",), ["p"] * 17, "late_peers"),
    (ADVERT, ("late_peers",), [""], "late_peers"),
    (ADVERT, ("late_peers",), ["x" * 129], "late_peers"),
    (m.ProgressRecord("a", ()), ("written_at",), INF, "written_at"),
    (m.ProgressRecord("a", ()), ("written_at",), -1.0, "written_at"),
    (TIMED, ("round_trip_s",), [0.5], "round_trip_s"),                 # one figure for two microbatches
    (TIMED, ("round_trip_s", 0), NAN, "round_trip_s[0]"),
    (TIMED, ("round_trip_s", 1), -0.1, "round_trip_s"),
    (TIMED, ("round_trip_s", 1), 1e9, "round_trip_s"),
    (TIMED, ("timed_microbatches",), list(range(65)), "round_trip_s"),
    (REPORT, ("links", 0, "bandwidth_bytes_s"), 0, "links[0].bandwidth_bytes_s"),
    (REPORT, ("links", 0, "rtt_ms"), NAN, "links[0].rtt_ms"),
    (m.ErrorReply(ErrorCode.INTERNAL, "x"), ("code",), 999, "code"),
    (m.ErrorReply(ErrorCode.INTERNAL, "x"), ("code",), "INTERNAL", "code"),
    (m.StreamChunk(TensorChunk("int8", (4,), 0, 2, 4, b"ab")), ("chunk", "index"), 2, "chunk.index"),
    (m.StreamChunk(TensorChunk("int8", (4,), 0, 2, 4, b"ab")), ("chunk", "total_bytes"), 5,
     "chunk.total_bytes"),
]


@pytest.mark.parametrize("message,path,value,field", BAD_FIELDS,
                         ids=[f"{type(c[0]).__name__}.{c[3]}={c[2]!r:.12}" for c in BAD_FIELDS])
def test_bad_field_raises_field_error_naming_it(message, path, value, field):
    body = to_plain(message)
    assert codec.decode(frame(code(type(message)), body)) == message   # the unmodified body is fine
    with pytest.raises(FieldError) as info:
        codec.decode(frame(code(type(message)), _set(body, path, value)))
    assert isinstance(info.value, DecodeError)
    assert info.value.field == field
    assert repr(field) in str(info.value)


@pytest.mark.parametrize("body", [None, [1], "nonce", 1, b"\x01"], ids=repr)
def test_body_must_be_a_map(body):
    with pytest.raises(FieldError):
        codec.decode(frame(code(m.Ping), body))


def test_body_missing_entirely():
    data = msgpack.packb({"v": [PROTOCOL_MAJOR, PROTOCOL_MINOR], "t": code(m.Ping)})
    with pytest.raises(FieldError):
        codec.decode(data)


def test_invalid_utf8_and_ext_values_are_decode_errors():
    bad_utf8 = b"\x83\xa1v\x92\x01\x00\xa1t\x1f\xa1b\x81\xa5nonce\xa2\xff\xfe"
    timestamp = b"\x83\xa1v\x92\x01\x00\xa1t\x1e\xa1b\x81\xa5nonce\xd6\xff\x00\x00\x00\x01"
    for data in (bad_utf8, timestamp):
        with pytest.raises(DecodeError):
            codec.decode(data)


@pytest.mark.parametrize("data", ["a string", None, 42, [b"\x80"]], ids=repr)
def test_non_bytes_input_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        codec.decode(data)


# ---------------------------------------------------------------------------------------------
# Mutation fuzzing
# ---------------------------------------------------------------------------------------------
mutations = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]),
                               st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=6)


def _mutate(data: bytes, ops) -> bytes:
    buf = bytearray(data)
    for op, pos, byte in ops:
        if op == "insert":
            buf.insert(pos % (len(buf) + 1), byte)
        elif not buf:
            continue
        elif op == "delete":
            del buf[pos % len(buf)]
        elif op == "flip":
            buf[pos % len(buf)] ^= 1 << (byte % 8)
        else:
            buf[pos % len(buf)] = byte
    return bytes(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_message, mutations)
def test_mutated_frames_raise_only_protocol_errors(message, ops):
    assert_only_protocol_errors(_mutate(codec.encode(message), ops))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(SAMPLES), mutations, st.sampled_from([None, m.Ping, (Schedule, PeerAdvert)]))
def test_mutated_frames_with_expected_type(message, ops, expected):
    result = assert_only_protocol_errors(_mutate(codec.encode(message), ops), expected=expected)
    if result is not None and expected is not None:
        assert isinstance(result, expected)


# ---------------------------------------------------------------------------------------------
# The exception tree
# ---------------------------------------------------------------------------------------------
def test_exception_tree_and_wire_codes():
    for exc in (DecodeError, MessageTooLarge, UnknownMessageType, FieldError, VersionMismatch,
                TensorError, TopologyError):
        assert issubclass(exc, ProtocolError)
    for exc in (MessageTooLarge, UnknownMessageType, FieldError):
        assert issubclass(exc, DecodeError)
    assert not issubclass(VersionMismatch, DecodeError)
    assert MessageTooLarge.code == ErrorCode.TOO_LARGE
    assert UnknownMessageType.code == ErrorCode.UNKNOWN_TYPE
    assert VersionMismatch.code == ErrorCode.VERSION_MISMATCH
    assert TensorError.code == ErrorCode.BAD_TENSOR
    assert FieldError("a.b", "bad").field == "a.b"
    assert [c.value for c in ErrorCode] == list(range(1, len(ErrorCode) + 1))
