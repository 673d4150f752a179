"""The msgpack envelope codec: the envelope itself (v, t, b), version rules, unknown and
missing fields, and the expected type."""
from __future__ import annotations

import msgpack
import pytest

from protocol import codec
from protocol import messages as m
from protocol.errors import DecodeError, ErrorCode, ProtocolError, UnknownMessageType, VersionMismatch
from protocol.plain import to_plain
from protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR
from tests.unit.protocol.codec_support import SAMPLES, code, frame


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


