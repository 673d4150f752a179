"""Choosing the organiser's spec or schedule among the values of one DHT key (issue 24): only
SignedRecords (protocol/signing.py) that open under the pinned key count; without a pinned key,
only when a single key signs them all (trust on first use)."""
from dataclasses import dataclass
from functools import lru_cache

from protocol import codec
from protocol.errors import ProtocolError
from protocol.signing import SignedRecord, verify


@dataclass(frozen=True)
class Opened:
    message: object | None         # the chosen record's message, or None
    signer: str | None             # the key it was signed with
    refused: int                   # records that were malformed or signed by another key
    problem: str = ""              # why nothing was chosen although signed records exist


def open_signed(raw_values: list[bytes], kind: str, expected: type, pinned: str | None,
                rank=lambda message: 0) -> Opened:
    """The highest-ranked `expected` among DHT values holding SignedRecords of `kind`.

    With a `pinned` key only its records count. Without one (a peer that joined with a plain
    run name) the records must all come from one key, which the caller then pins (trust on
    first use); two keys at once are refused, since the reader cannot tell which is the
    organiser. Ties in `rank` go to the later value (callers list values oldest first)."""
    found: list[tuple[object, str]] = []
    refused = 0
    for raw in raw_values:
        try:
            found.append(_open_one(raw, kind, expected, pinned))
        except ProtocolError:
            refused += 1
    if pinned is None and len({signer for _, signer in found}) > 1:
        return Opened(None, None, refused, f"records of this run are signed by {len({s for _, s in found})} "
                                           f"different keys: join with --run NAME@KEY (the coordinator prints it)")
    if not found:
        return Opened(None, None, refused)
    best = max(range(len(found)), key=lambda i: (rank(found[i][0]), i))
    return Opened(found[best][0], found[best][1], refused)


def _open_one(raw: bytes, kind: str, expected: type, pinned: str | None) -> tuple[object, str]:
    if not isinstance(raw, (bytes, bytearray)):     # anyone can store any msgpack value
        codec.decode(raw, expected=SignedRecord)      # raises DecodeError
    return _open_bytes(bytes(raw), kind, expected, pinned)


# Peers poll the schedule every few seconds and it rarely changes: a record already opened (the
# same bytes, kind, type and key) is not verified and decoded again; refusals raise, so they are
# never remembered. Messages are frozen. A few entries: a reader holds ~5 live records (spec,
# schedules, roster), and a schedule of hundreds of nodes is megabytes.
@lru_cache(maxsize=8)
def _open_bytes(raw: bytes, kind: str, expected: type, pinned: str | None) -> tuple[object, str]:
    record = codec.decode(raw, expected=SignedRecord)
    payload = verify(record, pinned or record.signer, kind)
    return codec.decode(payload, expected=expected), record.signer
