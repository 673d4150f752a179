"""The msgpack envelope codec: round trips of every message type, and strict, typed rejection
of everything else (only ProtocolError subclasses may ever escape `decode`)."""
from __future__ import annotations

import array
import copy
import dataclasses
import enum
import math
import time
import tracemalloc
import types
import typing

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol import messages as m
from protocol.adverts import LinkMeasurement, LinkReport, PeerAdvert, PeerState
from protocol.errors import (DecodeError, ErrorCode, FieldError, MessageTooLarge, ProtocolError,
                             TensorError, TopologyError, UnknownMessageType, VersionMismatch)
from protocol.plain import to_plain
from protocol.signing import KINDS, SignedRecord, sign
from protocol.schedule import Hop, OrderEntry, PeerOrder, Phase, Route, Schedule, StageAssignment
from protocol.tensors import DTYPE_ITEMSIZE, TensorChunk, TensorPayload
from protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Strategies: one per message type, values inside each class's valid range.
# ---------------------------------------------------------------------------------------------
i64 = st.integers(-(2**63), 2**63 - 1)
u63 = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
text = st.text(max_size=20)
run_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
ratios = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
dtypes = st.sampled_from(sorted(DTYPE_ITEMSIZE))
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def payloads(draw):
    dtype, shape = draw(dtypes), draw(shapes)
    n = math.prod(shape) * DTYPE_ITEMSIZE[dtype]
    return TensorPayload(dtype, shape, draw(st.binary(min_size=n, max_size=n)))


@st.composite
def chunks(draw):
    dtype, shape = draw(dtypes), draw(shapes)
    count = draw(st.integers(1, 6))
    return TensorChunk(dtype, shape, draw(st.integers(0, count - 1)), count,
                       math.prod(shape) * DTYPE_ITEMSIZE[dtype], draw(st.binary(max_size=16)))


@st.composite
def run_specs(draw):
    num_stages = draw(st.integers(1, 8))
    stage_sizes = draw(st.one_of(
        st.just(()), st.lists(st.integers(1, 10), min_size=num_stages, max_size=num_stages).map(tuple)))
    return m.RunSpec(
        run=draw(run_names), model=draw(text), num_stages=num_stages, skip_ratio=draw(ratios),
        seed=draw(i64), microbatch_samples=draw(st.integers(1, 2**31)),
        seq_len=draw(st.integers(1, 2**31)), microbatches_per_origin=draw(st.integers(1, 1000)),
        learning_rate=draw(st.floats(min_value=0.0, max_value=1.0, exclude_min=True)),
        warmup_steps=draw(st.integers(0, 2**63 - 1)),
        max_grad_norm=draw(st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)),
        stage_sizes=stage_sizes)


@st.composite
def peer_adverts(draw):
    start = draw(st.integers(0, 1000))
    return PeerAdvert(
        peer_id=draw(text), state=draw(st.sampled_from(PeerState)), device=draw(text),
        memory_free_bytes=draw(u63), fwd_s_per_layer_sample=draw(nonneg),
        stage=draw(st.integers(-1, 100)), layer_start=start,
        layer_end=start + draw(st.integers(0, 100)), memory_microbatches=draw(st.integers(1, 64)),
        maddrs=tuple(draw(st.lists(text, max_size=3))), public_name=draw(text),
        protocol_version=(draw(u63), draw(u63)), package_version=draw(text), timestamp=draw(finite))


link_reports = st.builds(
    LinkReport, peer_id=text,
    links=st.lists(st.builds(LinkMeasurement, peer_id=text, rtt_ms=nonneg,
                             bandwidth_bytes_s=st.floats(min_value=1e-9, max_value=1e15)),
                   max_size=4).map(tuple),
    timestamp=finite)

hops = st.builds(Hop, stage=st.integers(0, 64), peer=text)
routes = st.builds(Route, microbatch_id=u63, hops=st.lists(hops, min_size=1, max_size=5).map(tuple))
orders = st.builds(PeerOrder, peer=text, tasks=st.lists(
    st.builds(OrderEntry, microbatch_id=u63, phase=st.sampled_from(Phase)), max_size=5).map(tuple))
schedules = st.builds(
    Schedule, run=run_names, epoch=u63, strategy=st.sampled_from(["skippipe", "full", "random-skip"]),
    num_stages=st.integers(1, 64), skip_ratio=ratios,
    assignment=st.lists(st.builds(StageAssignment, peer=text, stage=st.integers(0, 64)),
                        max_size=4).map(tuple),
    routes=st.lists(routes, max_size=4).map(tuple), order=st.lists(orders, max_size=3).map(tuple),
    predicted_iteration_s=nonneg, seed=i64)

headers = st.builds(m.WorkHeader, run=run_names, epoch=u63, iteration=u63, microbatch_id=u63,
                    hop_index=st.integers(0, 64))

STRATEGIES: dict[type, st.SearchStrategy] = {
    m.RunSpec: run_specs(),
    PeerAdvert: peer_adverts(),
    LinkReport: link_reports,
    Schedule: schedules,
    m.ForwardRequest: st.builds(m.ForwardRequest, header=headers, tensor=payloads()),
    m.ForwardReply: st.builds(m.ForwardReply, header=headers, tensor=st.none() | payloads()),
    m.BackwardRequest: st.builds(m.BackwardRequest, header=headers, tensor=payloads()),
    m.BackwardReply: st.builds(m.BackwardReply, header=headers, tensor=st.none() | payloads()),
    m.StreamHead: st.builds(m.StreamHead, message=st.binary(max_size=64)),
    m.StreamChunk: st.builds(m.StreamChunk, chunk=chunks()),
    m.ErrorReply: st.builds(m.ErrorReply, code=st.sampled_from(ErrorCode), message=text, detail=text),
    m.Ping: st.builds(m.Ping, nonce=i64, payload=st.binary(max_size=64)),
    m.Pong: st.builds(m.Pong, nonce=i64, payload=st.binary(max_size=64)),
    TensorChunk: chunks(),
    SignedRecord: st.builds(lambda kind, payload, seed: sign(kind, payload, Ed25519PrivateKey.from_private_bytes(seed)),
                            st.sampled_from(KINDS), st.binary(max_size=64), st.binary(min_size=32, max_size=32)),
}


def _try_build(cls, kwargs):
    try:
        return cls(**kwargs)
    except FieldError:
        return None


def auto(tp) -> st.SearchStrategy:
    """A strategy derived from type hints, for message types without a hand-tuned one
    (so that a newly added type is round-tripped and fuzzed without touching this file)."""
    if tp is TensorPayload:
        return payloads()
    if tp is TensorChunk:
        return chunks()
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: auto(hints[f.name]) for f in dataclasses.fields(tp)}
        return (st.fixed_dictionaries(fields).map(lambda kw: _try_build(tp, kw))
                .filter(lambda x: x is not None))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return st.one_of(*(auto(a) for a in inner), *([st.none()] if type(None) in args else []))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(auto(args[0]), max_size=3).map(tuple)
        return st.tuples(*(auto(a) for a in args))
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        return st.sampled_from(tp)
    simple = {bool: st.booleans(), int: st.integers(0, 10_000), float: st.floats(0.0, 0.9),
              str: run_names, bytes: st.binary(max_size=32)}
    return simple[tp]


def strategy_for(cls) -> st.SearchStrategy:
    return STRATEGIES[cls] if cls in STRATEGIES else auto(cls)


any_message = st.one_of(*(strategy_for(cls) for cls in codec.TYPE_CODES))


@settings(max_examples=15, deadline=None)   # each example draws every type; the round trips draw far more
@given(st.data())
def test_every_message_type_has_a_strategy(data):
    for cls in codec.TYPE_CODES:
        assert isinstance(data.draw(strategy_for(cls)), cls)


def test_type_codes_are_fixed_and_unique():
    # Wire codes never change (append only): this table is the contract with deployed peers.
    published = {
        "RunSpec": 1, "PeerAdvert": 2, "LinkReport": 3, "Schedule": 4,
        "ForwardRequest": 10, "ForwardReply": 11, "BackwardRequest": 12, "BackwardReply": 13,
        "StreamHead": 14, "StreamChunk": 15, "GradientShare": 16, "GradientShareAck": 17,
        "IterationReport": 18, "ErrorReply": 20, "Ping": 30, "Pong": 31,
        "TensorChunk": 40,
    }
    current = {cls.__name__: code for cls, code in codec.TYPE_CODES.items()}
    assert {name: current.get(name) for name in published} == published
    assert all(type(c) is int and c > 0 for c in current.values())
    assert len(set(codec.TYPE_CODES.values())) == len(codec.TYPE_CODES)
    assert all(codec.TYPES_BY_CODE[code] is cls for cls, code in codec.TYPE_CODES.items())


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(codec.TYPE_CODES), ids=lambda c: c.__name__)
def test_round_trip_each_type(cls):
    @FAST
    @given(strategy_for(cls))
    def check(message):
        data = codec.encode(message)
        decoded = codec.decode(data)
        assert type(decoded) is cls
        assert decoded == message
        assert codec.decode(data, expected=cls) == message
        assert codec.encode(decoded) == data          # encoding is deterministic
        envelope = msgpack.unpackb(data, raw=False)
        assert set(envelope) == {"v", "t", "b"}
        assert envelope["v"] == [PROTOCOL_MAJOR, PROTOCOL_MINOR]
        assert envelope["t"] == codec.TYPE_CODES[cls]
        assert isinstance(envelope["b"], dict)
    check()


def test_round_trip_preserves_enums_and_tuples():
    advert = PeerAdvert("p", PeerState.ONLINE, "cpu", 10, 0.5, maddrs=("/ip4/1.2.3.4",))
    decoded = codec.decode(codec.encode(advert))
    assert type(decoded.state) is PeerState and decoded.state is PeerState.ONLINE
    assert type(decoded.maddrs) is tuple and type(decoded.protocol_version) is tuple
    err = codec.decode(codec.encode(m.ErrorReply(ErrorCode.STALE_SCHEDULE, "old")))
    assert err.code is ErrorCode.STALE_SCHEDULE


def test_decode_accepts_bytearray_and_memoryview():
    data = codec.encode(m.Ping(7, b"xy"))
    assert codec.decode(bytearray(data)) == m.Ping(7, b"xy")
    assert codec.decode(memoryview(data)) == m.Ping(7, b"xy")


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError):
        codec.encode({"nonce": 1})
    with pytest.raises(TypeError):
        codec.encode(m.WorkHeader("r", 0, 0, 0, 0))  # a part, not a top-level message


# ---------------------------------------------------------------------------------------------
# Helpers for hand-made frames
# ---------------------------------------------------------------------------------------------
def frame(t, body, v=(PROTOCOL_MAJOR, PROTOCOL_MINOR), **extra) -> bytes:
    return msgpack.packb({"v": list(v), "t": t, "b": body, **extra}, use_bin_type=True)


def code(cls) -> int:
    return codec.TYPE_CODES[cls]


def assert_only_protocol_errors(data, **kwargs):
    """decode either succeeds with a real message or raises a ProtocolError; anything else fails."""
    try:
        result = codec.decode(data, **kwargs)
    except ProtocolError:
        return None
    assert type(result) in codec.TYPE_CODES
    return result


# ---------------------------------------------------------------------------------------------
# Garbage and truncation
# ---------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_raise_only_protocol_errors(data):
    assert_only_protocol_errors(data)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_inside_a_valid_envelope_prefix(tail):
    # a real envelope start followed by junk exercises the deeper parsing paths
    head = frame(code(m.Ping), {"nonce": 1})[:12]
    assert_only_protocol_errors(head + tail)


SAMPLES = [
    m.Ping(12345, b"probe"),
    m.ErrorReply(ErrorCode.OVERLOADED, "busy", "try later"),
    m.ForwardRequest(m.WorkHeader("run-1", 3, 4, 5, 1), TensorPayload("float16", (2, 3), bytes(12))),
    Schedule("run-1", 2, "skippipe", 2, 0.25, (StageAssignment("a", 0), StageAssignment("b", 1)),
             (Route(0, (Hop(0, "a"), Hop(1, "b"))),), (PeerOrder("a", (OrderEntry(0, Phase.FORWARD),)),)),
    PeerAdvert("peer", PeerState.JOINING, "cuda:0", 2**40, 1e-4, maddrs=("/ip4/127.0.0.1/tcp/1",)),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda x: type(x).__name__)
def test_every_truncation_is_a_decode_error(message):
    data = codec.encode(message)
    assert codec.decode(data) == message
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(data[:n])


@pytest.mark.parametrize("message", SAMPLES, ids=lambda x: type(x).__name__)
def test_trailing_bytes_are_rejected(message):
    data = codec.encode(message)
    for tail in (b"\x00", b"\xc0", data):
        with pytest.raises(DecodeError):
            codec.decode(data + tail)


# ---------------------------------------------------------------------------------------------
# Size limits and hostile length headers
# ---------------------------------------------------------------------------------------------
def test_oversized_frame_is_rejected():
    data = codec.encode(m.Ping(1, bytes(1000)))
    assert codec.decode(data, max_bytes=len(data)) == m.Ping(1, bytes(1000))
    with pytest.raises(MessageTooLarge) as info:
        codec.decode(data, max_bytes=len(data) - 1)
    assert info.value.code == ErrorCode.TOO_LARGE


def test_size_is_checked_before_parsing():
    # 0xc1 is never valid msgpack: if parsing ran first we would get a plain DecodeError
    junk = b"\xc1" * 101
    with pytest.raises(DecodeError) as info:
        codec.decode(junk, max_bytes=1000)
    assert type(info.value) is DecodeError
    with pytest.raises(MessageTooLarge):
        codec.decode(junk, max_bytes=100)


def test_default_limit_is_four_mebibytes():
    assert codec.DEFAULT_MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    with pytest.raises(MessageTooLarge):
        codec.decode(b"\x00" * (codec.DEFAULT_MAX_MESSAGE_BYTES + 1))


def test_memoryview_size_is_counted_in_bytes():
    data = codec.encode(m.Ping(1, bytes(200)))
    data += b"\x00" * (-len(data) % 4)              # pad to whole 4-byte items
    view = memoryview(array.array("i", data))       # len(view) counts items, not bytes
    assert view.nbytes == len(data) and len(view) < len(data)
    with pytest.raises(MessageTooLarge):
        codec.decode(view, max_bytes=len(data) - 1)


HOSTILE_HEADERS = {
    "array32 of 2**31 items": b"\xdd\x80\x00\x00\x00",
    "array32 of 2**32-1 items": b"\xdd\xff\xff\xff\xff",
    "map32 of 2**31 pairs": b"\xdf\x80\x00\x00\x00",
    "str32 of 4 GiB": b"\xdb\xff\xff\xff\xff",
    "bin32 of 4 GiB": b"\xc6\xff\xff\xff\xff",
    "ext32 of 4 GiB": b"\xc9\xff\xff\xff\xff\x01",
    # the same lies nested where a body is expected
    "body array32": b"\x83\xa1v\x92\x01\x00\xa1t\x1e\xa1b\xdd\x80\x00\x00\x00",
    "body map32": b"\x83\xa1v\x92\x01\x00\xa1t\x1e\xa1b\xdf\x80\x00\x00\x00",
    "payload bin32": b"\x83\xa1v\x92\x01\x00\xa1t\x1e\xa1b\x82\xa5nonce\x01\xa7payload\xc6\x7f\xff\xff\xff",
    "deep nesting": b"\x91" * 200_000 + b"\xc0",
}


@pytest.mark.parametrize("data", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_huge_declared_lengths_are_rejected_without_allocating(data):
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(DecodeError):
            codec.decode(data, max_bytes=1_000_000)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 16 * 1024 * 1024


def test_container_cap_is_enforced_even_when_the_bytes_are_there():
    # 200k one-byte items fit easily in the byte limit but exceed the container cap
    body = b"\x83\xa1v\x92\x01\x00\xa1t\x1e\xa1b" + b"\xdd" + (200_000).to_bytes(4, "big") + b"\x00" * 200_000
    with pytest.raises(DecodeError):
        codec.decode(body, max_bytes=10_000_000)


# ---------------------------------------------------------------------------------------------
# Envelope problems
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("envelope", [[1, 0], 1, "v", None, b"bytes", 1.5, True, [], {}],
                         ids=repr)
def test_envelope_must_be_a_map_with_v_t_b(envelope):
    with pytest.raises(DecodeError):
        codec.decode(msgpack.packb(envelope, use_bin_type=True))


@pytest.mark.parametrize("version", [None, [1], [1, 0, 0], "1.0", [1, "0"], [True, 0], [1, 0.0],
                                     {"major": 1}], ids=repr)
def test_malformed_version_field(version):
    data = msgpack.packb({"v": version, "t": code(m.Ping), "b": {"nonce": 1}})
    with pytest.raises(DecodeError):
        codec.decode(data)


def test_missing_version_field():
    with pytest.raises(DecodeError):
        codec.decode(msgpack.packb({"t": code(m.Ping), "b": {"nonce": 1}}))


@pytest.mark.parametrize("t", [9999, 0, -1, 2**64 - 1, 5])
def test_unknown_type_code(t):
    with pytest.raises(UnknownMessageType) as info:
        codec.decode(frame(t, {"nonce": 1}))
    assert str(t) in str(info.value)
    assert info.value.code == ErrorCode.UNKNOWN_TYPE


@pytest.mark.parametrize("t", ["30", 30.0, True, None, [30], b"\x1e"], ids=repr)
def test_type_code_must_be_an_integer(t):
    with pytest.raises(DecodeError):
        codec.decode(frame(t, {"nonce": 1}))


def test_missing_type_code():
    with pytest.raises(DecodeError):
        codec.decode(msgpack.packb({"v": [PROTOCOL_MAJOR, PROTOCOL_MINOR], "b": {"nonce": 1}}))


@pytest.mark.parametrize("remote", [(PROTOCOL_MAJOR + 1, 0), (PROTOCOL_MAJOR + 1, 7),
                                    (PROTOCOL_MAJOR - 1, 3), (99, 0)])
def test_major_version_mismatch(remote):
    with pytest.raises(VersionMismatch) as info:
        codec.decode(frame(code(m.Ping), {"nonce": 1}, v=remote))
    err = info.value
    assert isinstance(err, ProtocolError) and not isinstance(err, DecodeError)
    assert err.remote == remote
    assert err.code == ErrorCode.VERSION_MISMATCH
    text_ = str(err)
    assert f"v{remote[0]}.{remote[1]}" in text_
    assert f"v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}" in text_


def test_version_is_checked_before_the_type_code():
    # a newer major may have new type codes: the useful error is the version one
    with pytest.raises(VersionMismatch):
        codec.decode(frame(9999, {"whatever": 1}, v=(PROTOCOL_MAJOR + 1, 0)))


@pytest.mark.parametrize("minor", [PROTOCOL_MINOR + 1, PROTOCOL_MINOR + 50, 2**32])
def test_higher_minor_version_is_accepted(minor):
    assert codec.decode(frame(code(m.Ping), {"nonce": 5}, v=(PROTOCOL_MAJOR, minor))) == m.Ping(5)


def test_unknown_fields_are_dropped():
    body = {"nonce": 9, "payload": b"ab", "added_in_v1_1": [1, {"x": b"y"}], "another": None}
    assert codec.decode(frame(code(m.Ping), body)) == m.Ping(9, b"ab")
    # ... at every nesting level, and in the envelope itself
    plain = to_plain(SAMPLES[2])
    plain["header"]["priority"] = 3
    plain["tensor"]["layout"] = "strided"
    assert codec.decode(frame(code(m.ForwardRequest), plain, trace_id="abc")) == SAMPLES[2]


def test_defaults_fill_missing_optional_fields():
    assert codec.decode(frame(code(m.Ping), {"nonce": 1})) == m.Ping(1, b"")
    reply = codec.decode(frame(code(m.ForwardReply), {"header": to_plain(SAMPLES[2].header)}))
    assert reply == m.ForwardReply(SAMPLES[2].header, None)


# ---------------------------------------------------------------------------------------------
# Expected type
# ---------------------------------------------------------------------------------------------
def test_expected_type_rejects_another_type():
    data = codec.encode(m.Ping(1))
    with pytest.raises(UnknownMessageType) as info:
        codec.decode(data, expected=m.Pong)
    assert "Pong" in str(info.value) and "Ping" in str(info.value)
    with pytest.raises(UnknownMessageType):
        codec.decode(data, expected=(m.Pong, m.ErrorReply))
    assert codec.decode(data, expected=(m.Pong, m.Ping)) == m.Ping(1)
    assert codec.decode(data, expected=m.Ping) == m.Ping(1)


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
