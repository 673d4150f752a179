"""Length-prefixed frames on a byte stream, with the size checked before allocating."""
import asyncio

from protocol.errors import MessageTooLarge

HEADER_BYTES = 4
MAX_FRAME_BYTES = 4 * 1024 * 1024


class FrameTooLarge(MessageTooLarge):
    """A ProtocolError, so the server answers TOO_LARGE instead of treating it as a crash."""


async def write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    if len(data) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    writer.write(len(data).to_bytes(HEADER_BYTES, "big"))
    writer.write(data)
    await writer.drain()


READ_PIECE_BYTES = 256 * 1024


class StreamIdle(TimeoutError):
    """The remote sent nothing for the idle timeout."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES,
                     idle_s: float | None = None) -> bytes:
    """One frame; with `idle_s`, StreamIdle as soon as no byte arrived for that long (a stream
    that sends nothing is cut in seconds, however slowly a big frame may legitimately trickle)."""
    header = await _exactly(reader, HEADER_BYTES, idle_s)
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise FrameTooLarge(f"incoming frame declares {length} bytes, limit is {max_bytes}")
    return await _exactly(reader, length, idle_s)


async def _exactly(reader: asyncio.StreamReader, n: int, idle_s: float | None) -> bytes:
    if idle_s is None:
        return await reader.readexactly(n)
    parts, got = [], 0
    while got < n:
        try:
            async with asyncio.timeout(idle_s):
                piece = await reader.read(min(n - got, READ_PIECE_BYTES))
        except TimeoutError:
            raise StreamIdle(f"nothing arrived for {idle_s:g}s") from None
        if not piece:
            raise asyncio.IncompleteReadError(b"".join(parts), n)
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)
