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


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    header = await reader.readexactly(HEADER_BYTES)
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise FrameTooLarge(f"incoming frame declares {length} bytes, limit is {max_bytes}")
    return await reader.readexactly(length)
