"""What the codec tests share: a hypothesis strategy for every message type, hand-made
frame helpers and sample messages (tests/unit/test_protocol_codec*.py)."""
from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from protocol import codec
from protocol import messages as m
from protocol.adverts import LinkMeasurement, LinkReport, PeerAdvert, PeerState
from protocol.errors import ErrorCode, FieldError, ProtocolError
from protocol.invitations import Roster
from protocol.signing import KINDS, SignedRecord, sign
from protocol.quantised import CODECS, MAX_BLOCK, MIN_BLOCK, Quantised
from protocol.spot_checks import REPORT_KINDS, SpotCheckReport
from protocol.schedule import Hop, LinkCodec, OrderEntry, PeerOrder, Phase, Route, Schedule, StageAssignment
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
        stage_sizes=stage_sizes, gradient_exchange=draw(st.sampled_from(m.GRADIENT_EXCHANGES)))


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
    predicted_iteration_s=nonneg, seed=i64,
    wire=st.lists(st.builds(LinkCodec, sender=text, receiver=text, codec=st.sampled_from(CODECS)),
                  max_size=3).map(tuple))
quantised = st.none() | st.builds(Quantised, codec=st.sampled_from(CODECS), block=st.integers(MIN_BLOCK, MAX_BLOCK),
                                  shape=shapes)

headers = st.builds(m.WorkHeader, run=run_names, epoch=u63, iteration=u63, microbatch_id=u63,
                    hop_index=st.integers(0, 64))

STRATEGIES: dict[type, st.SearchStrategy] = {
    m.RunSpec: run_specs(),
    PeerAdvert: peer_adverts(),
    LinkReport: link_reports,
    Schedule: schedules,
    m.ForwardRequest: st.builds(m.ForwardRequest, header=headers, tensor=payloads(), quantised=quantised),
    m.ForwardReply: st.builds(m.ForwardReply, header=headers, tensor=st.none() | payloads()),
    m.BackwardRequest: st.builds(m.BackwardRequest, header=headers, tensor=payloads(), quantised=quantised),
    m.BackwardReply: st.builds(m.BackwardReply, header=headers, tensor=st.none() | payloads()),
    m.StreamHead: st.builds(m.StreamHead, message=st.binary(max_size=64)),
    m.StreamChunk: st.builds(m.StreamChunk, chunk=chunks()),
    m.ErrorReply: st.builds(m.ErrorReply, code=st.sampled_from(ErrorCode), message=text, detail=text),
    m.Ping: st.builds(m.Ping, nonce=i64, payload=st.binary(max_size=64)),
    m.Pong: st.builds(m.Pong, nonce=i64, payload=st.binary(max_size=64)),
    TensorChunk: chunks(),
    SpotCheckReport: st.builds(SpotCheckReport, suspect=text, checker=text, epoch=u63, iteration=u63,
                               microbatch_id=u63, stage=st.integers(0, 64), relative_error=nonneg,
                               passed=st.booleans(), kind=st.sampled_from(REPORT_KINDS)),
    Roster: st.builds(Roster, run=text, version=u63, bindings=st.lists(st.tuples(text, text), max_size=3).map(tuple),
                      banned=st.lists(text, max_size=3).map(tuple), revoked=st.lists(text, max_size=3).map(tuple)),
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
    if tp in STRATEGIES:             # a hand-tuned one, also inside another message
        return STRATEGIES[tp]
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


def _iteration_reports() -> st.SearchStrategy:
    """Auto-derived, but with as many round trips as timed microbatches (rarely drawn apart)."""
    hints = typing.get_type_hints(m.IterationReport)
    base = {f.name: auto(hints[f.name]) for f in dataclasses.fields(m.IterationReport)
            if f.name not in ("timed_microbatches", "round_trip_s")}
    timed = st.lists(st.tuples(st.integers(0, 10_000), st.floats(0.0, 3600.0)), max_size=3)
    return st.builds(lambda kw, pairs: m.IterationReport(**kw, timed_microbatches=tuple(p[0] for p in pairs),
                                                         round_trip_s=tuple(p[1] for p in pairs)),
                     st.fixed_dictionaries(base), timed)


STRATEGIES[m.IterationReport] = _iteration_reports()


def strategy_for(cls) -> st.SearchStrategy:
    return STRATEGIES[cls] if cls in STRATEGIES else auto(cls)


any_message = st.one_of(*(strategy_for(cls) for cls in codec.TYPE_CODES))


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


SAMPLES = [
    m.Ping(12345, b"probe"),
    m.ErrorReply(ErrorCode.OVERLOADED, "busy", "try later"),
    m.ForwardRequest(m.WorkHeader("run-1", 3, 4, 5, 1), TensorPayload("float16", (2, 3), bytes(12))),
    Schedule("run-1", 2, "skippipe", 2, 0.25, (StageAssignment("a", 0), StageAssignment("b", 1)),
             (Route(0, (Hop(0, "a"), Hop(1, "b"))),), (PeerOrder("a", (OrderEntry(0, Phase.FORWARD),)),)),
    PeerAdvert("peer", PeerState.JOINING, "cuda:0", 2**40, 1e-4, maddrs=("/ip4/127.0.0.1/tcp/1",)),
]

