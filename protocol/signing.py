"""The organiser's signature on the control plane (issue 24): the run spec and every schedule
travel through the DHT inside a SignedRecord, and a peer opens one only under the key it
pinned when it joined (`--run NAME@KEY`). Anyone can write to the DHT; only the holder of the
organiser's private key can write something a peer will act on.

Ed25519 (RFC 8032): 32-byte public keys, written in text as KEY_PREFIX + unpadded urlsafe
base64, short enough for a join command. The signature covers a domain tag, the record kind
and the payload, so a signed spec can never be replayed as a schedule or vice versa.
"""
import base64
import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import ErrorCode, FieldError, ProtocolError

KEY_PREFIX = "ed25519:"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DOMAIN = b"skippipe-signed-record/v1\x00"


class SignatureError(ProtocolError):
    """A record not signed by the pinned organiser key (forged, altered, or another run's)."""

    code = ErrorCode.NOT_MEMBER


@dataclass(frozen=True)
class SignedRecord:
    kind: str              # what the payload is: "spec", "schedule", "roster" or "invite"
    payload: bytes         # codec.encode(the message)
    signer: str            # the organiser's public key (public_key_text)
    signature: bytes

    def __post_init__(self):
        if self.kind not in KINDS:
            raise FieldError("kind", f"must be one of {', '.join(KINDS)}")
        if len(self.signature) != SIGNATURE_BYTES:
            raise FieldError("signature", f"must be {SIGNATURE_BYTES} bytes")
        parse_public_key(self.signer, field="signer")


KINDS = ("spec", "schedule", "roster", "invite")   # invite: protocol/invitations.py


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return public_key_text_raw(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def parse_public_key(text: str, field: str = "key") -> Ed25519PublicKey:
    """The key of public_key_text(); a FieldError naming `field` for anything else."""
    if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
        raise FieldError(field, f"expected an organiser key starting with {KEY_PREFIX!r}")
    body = text[len(KEY_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise FieldError(field, "the organiser key is not valid base64") from None
    if len(raw) != PUBLIC_KEY_BYTES or public_key_text_raw(raw) != text:
        raise FieldError(field, f"an organiser key is {PUBLIC_KEY_BYTES} bytes in canonical base64")
    return Ed25519PublicKey.from_public_bytes(raw)


def public_key_text_raw(raw: bytes) -> str:
    return KEY_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _signed_bytes(kind: str, payload: bytes) -> bytes:
    return DOMAIN + kind.encode("ascii") + b"\x00" + payload


def sign(kind: str, payload: bytes, key: Ed25519PrivateKey) -> SignedRecord:
    return SignedRecord(kind, payload, public_key_text(key), key.sign(_signed_bytes(kind, payload)))


def verify(record: SignedRecord, pinned: str, kind: str) -> bytes:
    """The payload of `record` if it is a `kind` signed by the `pinned` key; else SignatureError."""
    if record.kind != kind:
        raise SignatureError(f"expected a signed {kind}, got a signed {record.kind}")
    if record.signer != pinned:
        raise SignatureError(f"signed by {record.signer[:20]}..., not by the run's organiser key {pinned[:20]}...")
    try:
        parse_public_key(pinned).verify(record.signature, _signed_bytes(kind, record.payload))
    except InvalidSignature:
        raise SignatureError(f"the {kind}'s signature does not match its content (forged or altered)") from None
    return record.payload


def split_run_address(text: str) -> tuple[str, str | None]:
    """`NAME@KEY` -> (NAME, KEY); a plain NAME -> (NAME, None). The key is checked here."""
    name, sep, key = text.partition("@")
    if not sep:
        return name, None
    parse_public_key(key, field="run")
    return name, key

