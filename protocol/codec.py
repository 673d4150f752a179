"""The msgpack envelope `{"v": [major, minor], "t": <type code>, "b": <body>}`.

Type codes are fixed integers (never class names, never pickle). Decoding checks the size
before parsing, caps every msgpack container so a hostile frame cannot make us allocate
much, checks the version, and validates the body field by field.
"""
from typing import Any

import msgpack

from protocol import messages as m
from protocol.adverts import LinkReport, PeerAdvert
from protocol.invitations import Roster
from protocol.errors import DecodeError, MessageTooLarge, ProtocolError, UnknownMessageType
from protocol.plain import from_plain, to_plain
from protocol.schedule import Schedule
from protocol.signing import SignedRecord
from protocol.spot_checks import (SpotCheckGradient, SpotCheckGradientReference, SpotCheckRecord, SpotCheckReference,
                                  SpotCheckReport, SpotCheckRequest)
from protocol.tensors import TensorChunk
from protocol.version import PROTOCOL_VERSION, check_compatible

# Fixed wire codes: append only, never renumber.
TYPE_CODES: dict[type, int] = {
    m.RunSpec: 1,
    PeerAdvert: 2,
    LinkReport: 3,
    Schedule: 4,
    m.ForwardRequest: 10,
    m.ForwardReply: 11,
    m.BackwardRequest: 12,
    m.BackwardReply: 13,
    m.StreamHead: 14,
    m.StreamChunk: 15,
    m.GradientShare: 16,
    m.GradientShareAck: 17,
    m.IterationReport: 18,
    m.ProgressRecord: 19,
    m.ErrorReply: 20,
    m.IterationDone: 21,
    m.MicrobatchFailed: 22,
    m.Ack: 23,
    m.StateRequest: 24,
    m.StateReply: 25,
    m.WeightsRequest: 26,
    m.WeightsReply: 27,
    m.DataRequest: 28,
    m.DataReply: 29,
    m.Ping: 30,
    m.Pong: 31,
    TensorChunk: 40,
    SpotCheckReport: 50,
    SpotCheckRecord: 51,
    SpotCheckRequest: 52,
    SpotCheckReference: 53,
    SpotCheckGradient: 54,          # v1.7: backward spot checks
    SpotCheckGradientReference: 55,
    SignedRecord: 60,          # v1.4: the organiser's signature on the spec and schedules
    Roster: 61,                # v1.5: who was admitted by invitation, and who was banned
}
TYPES_BY_CODE: dict[int, type] = {code: cls for cls, code in TYPE_CODES.items()}

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MAX_CONTAINER_ITEMS = 100_000


def encode(message: Any) -> bytes:
    try:
        code = TYPE_CODES[type(message)]
    except KeyError:
        raise TypeError(f"{type(message).__name__} is not a protocol message") from None
    return msgpack.packb({"v": list(PROTOCOL_VERSION), "t": code, "b": to_plain(message)},
                         use_bin_type=True)


def decode(data: bytes, expected: type | tuple[type, ...] | None = None,
           max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Parse and validate one message. Raises a ProtocolError subclass, never anything else."""
    return decode_versioned(data, expected, max_bytes)[0]


def decode_versioned(data: bytes, expected: type | tuple[type, ...] | None = None,
                     max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[Any, tuple[int, int]]:
    """decode(), and the (major, minor) the sender speaks: a reply's tells a client which
    optional features (a minor version's) the remote reads."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > max_bytes:
        raise MessageTooLarge(f"message of {size} bytes exceeds the limit of {max_bytes}")
    envelope = _unpack(bytes(data), max_bytes)
    cls = _envelope_type(envelope)
    version = (envelope["v"][0], envelope["v"][1])
    if expected is not None and not issubclass(cls, expected):
        names = expected.__name__ if isinstance(expected, type) else "/".join(e.__name__ for e in expected)
        raise UnknownMessageType(f"expected {names}, got {cls.__name__}")
    try:
        return from_plain(cls, envelope.get("b"), ""), version
    except ProtocolError:
        raise
    except Exception as exc:  # defensive: a schema bug must not crash a peer
        raise DecodeError(f"invalid {cls.__name__} body: {exc}") from None


def _unpack(data: bytes, max_bytes: int) -> dict:
    try:
        envelope = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=max_bytes, max_bin_len=max_bytes,
            max_array_len=_MAX_CONTAINER_ITEMS, max_map_len=_MAX_CONTAINER_ITEMS, max_ext_len=0,
        )
    except Exception as exc:
        raise DecodeError(f"not a valid msgpack frame: {type(exc).__name__}: {exc}") from None
    if not isinstance(envelope, dict):
        raise DecodeError("envelope must be a map with keys v, t, b")
    return envelope


def _envelope_type(envelope: dict) -> type:
    version = envelope.get("v")
    if (not isinstance(version, list) or len(version) != 2
            or not all(type(x) is int for x in version)):
        raise DecodeError("envelope field 'v' must be [major, minor]")
    check_compatible((version[0], version[1]))
    code = envelope.get("t")
    if type(code) is not int:
        raise DecodeError("envelope field 't' must be an integer type code")
    try:
        return TYPES_BY_CODE[code]
    except KeyError:
        raise UnknownMessageType(f"unknown message type code {code}") from None
