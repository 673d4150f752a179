"""The msgpack envelope codec: round trips of every message type, garbage, truncation and
size limits (only ProtocolError subclasses may ever escape `decode`). Strategies and samples:
tests/unit/protocol/codec_support.py; envelope and versions: test_protocol_codec_envelope.py; fields,
mutations and the exception tree: test_protocol_codec_fields.py."""
from __future__ import annotations

import array
import time
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol import messages as m
from protocol.adverts import PeerAdvert, PeerState
from protocol.errors import DecodeError, ErrorCode, MessageTooLarge
from protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR
from tests.unit.protocol.codec_support import FAST, SAMPLES, assert_only_protocol_errors, code, frame, strategy_for


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


