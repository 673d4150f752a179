"""In-process transport for unit tests: peers in one event loop, no sockets."""
from typing import Sequence

from peer.transport.base import Handler, OnSent, Transport, TransportError
from peer.transport.framing import MAX_FRAME_BYTES


class MemoryNetwork:
    """The set of in-memory peers that can reach each other."""

    def __init__(self):
        self.handlers: dict[str, Handler] = {}
        self.cut: set[str] = set()          # partitioned peers: nothing gets to or from them

    def transport(self, peer_id: str) -> "MemoryTransport":
        return MemoryTransport(self, peer_id)


class MemoryTransport(Transport):
    def __init__(self, network: MemoryNetwork, peer_id: str):
        self.network = network
        self.peer_id = peer_id

    async def request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent = None) -> bytes:
        handler = self.network.handlers.get(peer)
        if handler is None or {peer, self.peer_id} & self.network.cut:
            raise TransportError(peer, "failed to dial: no such peer")
        if any(len(f) > MAX_FRAME_BYTES for f in frames):
            raise TransportError(peer, "frame too large")
        pending = list(frames)
        if on_sent is not None:     # handed over in one piece
            on_sent()

        async def recv() -> bytes:
            if not pending:
                raise TransportError(self.peer_id, "request ended early")
            return pending.pop(0)

        import asyncio
        try:
            async with asyncio.timeout(timeout):
                return await handler(self.peer_id, recv)
        except TimeoutError:
            raise TransportError(peer, f"no reply within {timeout:.1f}s") from None

    async def serve(self, handler: Handler) -> None:
        self.network.handlers[self.peer_id] = handler

    async def close(self) -> None:
        self.network.handlers.pop(self.peer_id, None)
