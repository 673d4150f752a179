"""Typed request/reply over a Transport: protocol messages in, protocol messages out.

Requests carrying a tensor larger than `unary_tensor_bytes` travel as a StreamHead frame
followed by TensorChunk frames; the server reassembles them (bounded) before dispatch.
The server never raises: every failure becomes an ErrorReply with a wire error code.
"""
import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable

from protocol import codec
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.spot_checks import SpotCheckGradient, SpotCheckGradientReference, SpotCheckReference, SpotCheckRequest
from protocol.tensors import (ChunkAssembler, DEFAULT_CHUNK_BYTES, DEFAULT_MAX_TENSOR_BYTES,
                              TensorPayload, split_payload)

from peer.security.limits import Admission, Overloaded
from peer.security.membership import MemberGate
from peer.transport.base import RecvFrame, Transport, TransportError
from peer.transport.lanes import SendLanes

logger = logging.getLogger(__name__)
UNARY_TENSOR_BYTES = 1024 * 1024
_STREAMABLE = (m.ForwardRequest, m.BackwardRequest, m.GradientShare, SpotCheckRequest, SpotCheckReference,
               SpotCheckGradient, SpotCheckGradientReference)
_PLACEHOLDER = TensorPayload("uint8", (0,), b"")


class RemoteError(Exception):
    """The remote answered with an ErrorReply."""

    def __init__(self, peer: str, reply: m.ErrorReply):
        super().__init__(f"peer {peer[:12]} replied {reply.code.name}: {reply.message}")
        self.peer = peer
        self.code = reply.code
        self.reply = reply


class RpcClient:
    def __init__(self, transport: Transport, unary_tensor_bytes: int = UNARY_TENSOR_BYTES,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.transport = transport
        self.lanes = SendLanes(transport)
        self.unary_tensor_bytes = unary_tensor_bytes
        self.chunk_bytes = chunk_bytes
        # the protocol version each peer's latest reply spoke: which optional (minor-version)
        # features it reads, e.g. quantised tensors (peer/pipeline/wire.py)
        self.versions: dict[str, tuple[int, int]] = {}

    def frames_for(self, message: Any) -> list[bytes]:
        tensor = getattr(message, "tensor", None)
        if not isinstance(message, _STREAMABLE) or tensor is None or tensor.nbytes <= self.unary_tensor_bytes:
            return [codec.encode(message)]
        inner = codec.encode(dataclasses.replace(message, tensor=_PLACEHOLDER))
        head = codec.encode(m.StreamHead(inner))
        return [head] + [codec.encode(m.StreamChunk(c)) for c in split_payload(tensor, self.chunk_bytes)]

    async def call(self, peer: str, message: Any, timeout: float) -> Any:
        """Send `message`; return the decoded reply. Raises TransportError, RemoteError,
        or ProtocolError when the reply itself is malformed."""
        frame = await self.lanes.request(peer, self.frames_for(message), timeout)
        reply, self.versions[peer] = codec.decode_versioned(frame)
        if isinstance(reply, m.ErrorReply):
            raise RemoteError(peer, reply)
        return reply


MessageHandler = Callable[[str, Any], Awaitable[Any]]


class RpcServer:
    """Decodes requests and dispatches them by message type to registered handlers.

    Optional guards run before a request is read: `gate` (membership: strangers get NOT_MEMBER)
    and `admission` (rate limits, bounded concurrency and stream bytes, per peer and in total:
    OVERLOADED); with admission, a whole request must also arrive within its deadline."""

    def __init__(self, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES, admission: Admission | None = None,
                 gate: MemberGate | None = None):
        self.max_tensor_bytes = max_tensor_bytes
        self.admission = admission
        self.gate = gate
        self.handlers: dict[type, MessageHandler] = {}
        self.rejected = 0  # requests answered with an error, for status and tests

    def register(self, message_type: type, handler: MessageHandler) -> None:
        self.handlers[message_type] = handler

    async def handle(self, remote: str, recv: RecvFrame) -> bytes:
        if self.gate is not None and not await self.gate.admit(remote):
            return self._error(ErrorCode.NOT_MEMBER, "not a member of this run: no valid join-key proof "
                                                     "in your advert (start the peer with --join-key)")
        if self.admission is None:
            return await self._handle(remote, recv)
        try:
            self.admission.enter(remote)
        except Overloaded as exc:
            return self._error(ErrorCode.OVERLOADED, str(exc))
        try:
            return await self._handle(remote, recv)
        finally:
            self.admission.leave(remote)

    async def _handle(self, remote: str, recv: RecvFrame) -> bytes:
        reserved = [0]
        try:
            if self.admission is None:
                request = await self._read_request(remote, recv, reserved)
            else:
                async with asyncio.timeout(self.admission.limits.request_deadline_s):
                    request = await self._read_request(remote, recv, reserved)
            handler = self.handlers.get(type(request))
            if handler is None:
                return self._error(ErrorCode.UNKNOWN_TYPE, f"no handler for {type(request).__name__}")
            reply = await handler(remote, request)
            return codec.encode(reply)
        except ProtocolError as exc:
            return self._error(exc.code, str(exc))
        except Overloaded as exc:
            return self._error(ErrorCode.OVERLOADED, str(exc))
        except (TransportError, TimeoutError) as exc:
            return self._error(ErrorCode.MALFORMED, f"incomplete request: {exc or 'deadline passed'}")
        except Exception as exc:  # a handler bug must not crash the peer: report it
            logger.exception("handler failed for a request from %s", remote[:12])
            return self._error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            if reserved[0]:
                self.admission.release_stream(reserved[0], remote)

    async def _read_request(self, remote: str, recv: RecvFrame, reserved: list[int]) -> Any:
        first = codec.decode(await recv())
        if not isinstance(first, m.StreamHead):
            return first
        request = codec.decode(first.message, expected=_STREAMABLE)
        assembler = ChunkAssembler(self.max_tensor_bytes)
        while True:
            part = codec.decode(await recv(), expected=m.StreamChunk)
            if self.admission is not None:   # what it holds, not what it declares (issue 24)
                self.admission.reserve_stream(len(part.chunk.data), remote)
                reserved[0] += len(part.chunk.data)
            payload = assembler.add(part.chunk)
            if payload is not None:
                return dataclasses.replace(request, tensor=payload)

    def _error(self, code: ErrorCode, message: str) -> bytes:
        self.rejected += 1
        return codec.encode(m.ErrorReply(code, message))
