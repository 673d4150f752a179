"""Decoding DHT records (subkey -> encoded message) while skipping bad ones.

The DHT is shared with strangers: one malformed or forged record must not hide the others.
"""
from typing import Any, Callable

from protocol import codec
from protocol.errors import ProtocolError


def decode_subkey_records(records: Any, expected: type,
                          owner_of: Callable[[Any], str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """`records`: {subkey: bytes} (values already unwrapped). Returns ({peer id: message}, problems).

    `owner_of(subkey)` gives the peer id that owns a subkey (raising ValueError if none); by
    default the subkey is the peer id itself. A record whose `peer_id` is not its owner's is
    forged and dropped."""
    decoded: dict[str, Any] = {}
    problems: list[str] = []
    if not isinstance(records, dict):
        return decoded, ["record is not a subkey dictionary"]
    for subkey, value in records.items():
        try:
            owner = subkey if owner_of is None else owner_of(subkey)
            message = codec.decode(value, expected=expected)
        except (ProtocolError, ValueError) as exc:
            problems.append(f"{str(subkey)[:24]}: {exc}")
            continue
        claimed = getattr(message, "peer_id", None)
        if claimed is not None and claimed != owner:
            problems.append(f"{str(owner)[:16]}: record claims to be from {str(claimed)[:16]}")
            continue
        decoded[owner if claimed is None else claimed] = message
    return decoded, problems


def dht_values(value: Any) -> list[bytes]:
    """The byte values of one DHT key, oldest expiry first: a plain value is one; a subkey
    dictionary (hivemind's {subkey: ValueWithExpiration}) gives one per subkey."""
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [bytes(value)]
    if isinstance(value, dict):
        entries = sorted(value.values(), key=lambda e: getattr(e, "expiration_time", 0.0))
        return [bytes(e.value) for e in entries if isinstance(getattr(e, "value", None), (bytes, bytearray))]
    return []
