"""The transport interface: send a request (one or more frames), get one reply frame.

Two implementations: `hivemind_p2p.HivemindTransport` (real libp2p streams through p2pd) and
`memory.MemoryTransport` (in-process, for fast unit tests). Everything above this layer is
written against `Transport` only, so the same pipeline code runs over both.
"""
import abc
from typing import Awaitable, Callable, Sequence

# A handler gets the remote peer id and a function returning the request's next frame;
# it returns the reply frame. It must not raise (answer with an ErrorReply instead).
RecvFrame = Callable[[], Awaitable[bytes]]
Handler = Callable[[str, RecvFrame], Awaitable[bytes]]
# Called once, when a request's bytes have left us (written to the stream, or through the
# emulated link): the reply is still to come. peer/transport/lanes.py releases a link there.
OnSent = Callable[[], None] | None


class TransportError(Exception):
    """The remote could not be reached or did not answer in time."""

    def __init__(self, peer: str, problem: str):
        super().__init__(f"peer {peer[:12]}…: {problem}" if len(peer) > 12 else f"peer {peer}: {problem}")
        self.peer = peer
        self.problem = problem


class Transport(abc.ABC):
    peer_id: str

    @abc.abstractmethod
    async def request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent = None) -> bytes:
        """Send `frames` to `peer` and return its reply frame; raises TransportError.
        `on_sent` (optional) is called once the frames are written, before the reply."""

    @abc.abstractmethod
    async def serve(self, handler: Handler) -> None:
        """Start answering incoming requests with `handler`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop serving; idempotent."""
