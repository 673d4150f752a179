"""One exception tree for the protocol, plus the wire error codes sent in ErrorReply.

ProtocolError
├── DecodeError          malformed bytes or a body that does not match the schema
│   ├── MessageTooLarge  over a configured size limit (checked before allocating)
│   ├── UnknownMessageType
│   └── FieldError       a named field is missing or has the wrong type/value
├── VersionMismatch      remote major version differs from ours
├── TensorError          tensor payload inconsistent (dtype, shape, size, chunks)
└── TopologyError        a topology file is invalid (names the field)
"""
from enum import IntEnum


class ErrorCode(IntEnum):
    """Codes carried by ErrorReply. Fixed numbers: never renumber, only append."""

    MALFORMED = 1
    VERSION_MISMATCH = 2
    TOO_LARGE = 3
    UNKNOWN_TYPE = 4
    BAD_TENSOR = 5
    STALE_SCHEDULE = 6
    UNKNOWN_RUN = 7
    WRONG_STAGE = 8
    OVERLOADED = 9
    INTERNAL = 10
    NOT_MEMBER = 11
    NON_FINITE = 12
    UNKNOWN_MICROBATCH = 13
    SHUTTING_DOWN = 14
    DUPLICATE = 15                  # already have this (a retried send that got through)
    ITERATION_OVER = 16             # the receiver has finished that iteration: do not retry
    NOT_FOUND = 17                  # no such dataset or file here (v1.3)


class ProtocolError(Exception):
    """Base of every error raised by protocol/. `code` is what goes on the wire."""

    code = ErrorCode.MALFORMED


class DecodeError(ProtocolError):
    code = ErrorCode.MALFORMED


class MessageTooLarge(DecodeError):
    code = ErrorCode.TOO_LARGE


class UnknownMessageType(DecodeError):
    code = ErrorCode.UNKNOWN_TYPE


class FieldError(DecodeError):
    """A field failed validation; `field` is its dotted path, e.g. 'hops[2].stage'."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field!r}: {problem}")
        self.field = field
        self.problem = problem


class VersionMismatch(ProtocolError):
    code = ErrorCode.VERSION_MISMATCH

    def __init__(self, message: str, remote: tuple[int, int] | None = None):
        super().__init__(message)
        self.remote = remote


class TensorError(ProtocolError):
    code = ErrorCode.BAD_TENSOR


class TopologyError(ProtocolError):
    """Invalid topology file; `field` names the offending JSON path."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"topology field {field!r}: {problem}")
        self.field = field
        self.problem = problem
