"""Transport over hivemind's P2P (libp2p through p2pd): one binary stream per request.

We use raw binary streams with our own length-prefixed frames instead of hivemind's protobuf
handlers because (a) we bound every frame's size before allocating, (b) a handler error on
hivemind's unary path is lost (see shared/design/hivemind.md), and (c) large tensors stream
as chunk frames on the same stream.
"""
import asyncio
import logging
import time
from functools import lru_cache
from typing import Awaitable, Callable, Sequence

from hivemind.p2p import P2P, PeerID

from peer.transport.base import Handler, OnSent, Transport, TransportError
from peer.transport.framing import StreamIdle, read_frame, write_frame

logger = logging.getLogger(__name__)
PROTOCOL_NAME = "skippipe.v1"
ITEM_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 5.0     # a request stream that sends nothing for this long is cut (issue 24)
DIAL_FAILED = "failed to dial"   # p2pd's words when no address of the peer answered


@lru_cache(maxsize=4096)
def _peer_id(peer: str) -> PeerID:
    """hivemind's PeerID does base58 both ways in pure Python: once per peer, not per request."""
    return PeerID.from_base58(peer)


class _DialFailed(TransportError):
    """The stream never opened: p2pd could not reach the peer by any address it knows."""


class HivemindTransport(Transport):
    def __init__(self, p2p: P2P, item_timeout: float = ITEM_TIMEOUT_S, idle_timeout: float = IDLE_TIMEOUT_S):
        self.p2p = p2p
        self.peer_id = p2p.peer_id.to_base58()
        self.item_timeout = item_timeout
        self.idle_timeout = min(idle_timeout, item_timeout)
        self._serving = False
        # (peer, timeout_s, dial error) -> whether p2pd now reaches peer another way (redial.py)
        self.redial: Callable[[str, float, str], Awaitable[bool]] | None = None

    async def request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent = None) -> bytes:
        deadline = time.monotonic() + timeout
        try:
            return await self._request(peer, frames, timeout, on_sent)
        except _DialFailed as exc:
            # nothing was sent: once p2pd reaches the peer by its advertised addresses, send again
            if self.redial is None or not await self.redial(peer, deadline - time.monotonic(), exc.problem):
                raise
        return await self._request(peer, frames, max(deadline - time.monotonic(), 0.1), on_sent)

    async def _request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent) -> bytes:
        writer = None
        try:
            async with asyncio.timeout(timeout):
                _, reader, writer = await self.p2p.call_binary_stream_handler(_peer_id(peer), PROTOCOL_NAME)
                for frame in frames:
                    await write_frame(writer, frame)
                if on_sent is not None:
                    on_sent()
                return await read_frame(reader)
        except TimeoutError:
            raise TransportError(peer, f"no reply within {timeout:.1f}s") from None
        except asyncio.IncompleteReadError:
            raise TransportError(peer, "connection closed before the reply") from None
        except Exception as exc:  # p2pd dial failures come as various types
            problem = f"{type(exc).__name__}: {exc}"
            if writer is None and DIAL_FAILED in str(exc):
                raise _DialFailed(peer, problem) from None
            raise TransportError(peer, problem) from None
        finally:
            if writer is not None:
                writer.close()

    async def serve(self, handler: Handler) -> None:
        async def on_stream(stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
            remote = stream_info.peer_id.to_base58()

            async def recv() -> bytes:
                try:
                    async with asyncio.timeout(self.item_timeout):
                        return await read_frame(reader, idle_s=self.idle_timeout)
                except (asyncio.IncompleteReadError, ConnectionError):  # the remote hung up mid-request
                    raise TransportError(remote, "stream closed before the request was complete") from None
                except StreamIdle:  # an idle stream holds a request slot: cut it in seconds
                    raise TransportError(remote, f"nothing sent for {self.idle_timeout:g}s") from None
                except TimeoutError:  # a partial stream: one frame may take at most item_timeout
                    raise TransportError(remote, f"no frame within {self.item_timeout:.0f}s") from None

            try:
                reply = await handler(remote, recv)
                await write_frame(writer, reply)
            except Exception as exc:  # a broken stream from a remote must never take us down
                logger.debug("stream from %s failed: %s", remote, exc)
            finally:
                writer.close()

        await self.p2p.add_binary_stream_handler(PROTOCOL_NAME, on_stream)
        self._serving = True

    async def close(self) -> None:
        if self._serving:
            self._serving = False
            try:
                await self.p2p.remove_binary_stream_handler(PROTOCOL_NAME)
            except Exception as exc:
                logger.debug("removing stream handler failed: %s", exc)
