"""The SkipPipe Swarm wire contract: versions, message types, codec, topology format.

Depends on the standard library and msgpack only (no torch, no hivemind, no asyncio), so
that every other part of the project, and third-party tools, can import it cheaply.
"""
from protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR, PROTOCOL_VERSION

__all__ = ["PROTOCOL_MAJOR", "PROTOCOL_MINOR", "PROTOCOL_VERSION"]
