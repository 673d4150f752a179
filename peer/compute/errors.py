"""Errors raised by peer/compute. Each carries the wire code a server should answer with.

ComputeError
├── BadTensor (also ValueError)     wrong shape/dtype/range, or NaN/Inf, in an incoming tensor
├── StashFull                       the activation stash holds max_stash microbatches already
├── UnknownMicrobatch (also KeyError) no stash entry for this key (never seen, expired, dropped)
├── OutOfOrder                       a call that does not fit the key's state (second forward,
│                                   backward at the origin before its head_loss, ...)
└── WrongStage                      an origin-only call on a non-origin stage, or the reverse
"""
from protocol.errors import ErrorCode


class ComputeError(Exception):
    code = ErrorCode.INTERNAL


class BadTensor(ComputeError, ValueError):
    code = ErrorCode.BAD_TENSOR

    def __init__(self, what: str, problem: str, non_finite: bool = False):
        super().__init__(f"{what}: {problem}")
        self.what, self.problem = what, problem
        if non_finite:
            self.code = ErrorCode.NON_FINITE


class StashFull(ComputeError):
    code = ErrorCode.OVERLOADED


class UnknownMicrobatch(ComputeError, KeyError):
    code = ErrorCode.UNKNOWN_MICROBATCH

    def __str__(self):                        # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OutOfOrder(ComputeError, RuntimeError):
    code = ErrorCode.MALFORMED


class WrongStage(ComputeError, RuntimeError):
    code = ErrorCode.WRONG_STAGE
