"""Decoding DHT records (subkey -> encoded message) while skipping bad ones.

The DHT is shared with strangers: one malformed or forged record must not hide the others.
"""
from typing import Any

from protocol import codec
from protocol.errors import ProtocolError


def decode_subkey_records(records: Any, expected: type) -> tuple[dict[str, Any], list[str]]:
    """`records`: {subkey: bytes} (values already unwrapped). Returns (decoded, problems)."""
    decoded: dict[str, Any] = {}
    problems: list[str] = []
    if not isinstance(records, dict):
        return decoded, ["record is not a subkey dictionary"]
    for subkey, value in records.items():
        try:
            message = codec.decode(value, expected=expected)
        except ProtocolError as exc:
            problems.append(f"{str(subkey)[:16]}: {exc}")
            continue
        owner = getattr(message, "peer_id", None)
        if owner is not None and owner != subkey:
            problems.append(f"{str(subkey)[:16]}: record claims to be from {str(owner)[:16]}")
            continue
        decoded[subkey] = message
    return decoded, problems
