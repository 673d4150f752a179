"""Admission per volunteer (issue 24): invitations the organiser signs, and the roster of who
was admitted and who was banned.

An invitation token (`skippipe-coordinator invite`) carries a fresh Ed25519 *invite key* and the
organiser's certificate for it (its signature over the run, the invitation id and the invite
key's public half), plus the organiser's public key, so a volunteer who passes `--invite TOKEN`
pins the run's key from it. The volunteer's advert then carries a *claim*: the certificate and
the invite key's signature over the run and the volunteer's peer id. Anyone holding the pinned
organiser key can check a claim offline (every DHT node does, at store time); a claim copied
from a public advert names its peer id and nobody else's, and the token's secret half never
leaves the volunteer.

An invitation is bound to the first identity that uses it: the coordinator records the first
peer id it sees claiming it and publishes the bindings, with the banned peer ids and revoked
invitations, in a signed `Roster`; from then on a claim of that invitation by any other peer id
is refused. Between a first claim and the next roster (one coordinator round) a token holder
could use it from several identities; the roster then keeps the first only.
"""
import base64
import binascii
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import FieldError
from protocol.signing import (PUBLIC_KEY_BYTES, SIGNATURE_BYTES, SignatureError, SignedRecord, public_key_text,
                              public_key_text_raw, sign, verify)

TOKEN_PREFIX = "skpinv1."
INVITE_ID_BYTES = 8
SEED_BYTES = 32
_TOKEN_BYTES = PUBLIC_KEY_BYTES + INVITE_ID_BYTES + SEED_BYTES + SIGNATURE_BYTES
CLAIM_BYTES = INVITE_ID_BYTES + PUBLIC_KEY_BYTES + 2 * SIGNATURE_BYTES
_CLAIM_DOMAIN = b"skippipe-invite-claim/v1\x00"
MAX_ROSTER_ENTRIES = 10_000


class InvitationError(ValueError):
    """A token that is not a SkipPipe invitation (the message says why)."""


@dataclass(frozen=True)
class Invitation:
    invite_id: str                 # hex, public: what the roster and `ban` name
    organiser_key: str             # public_key_text of the run's organiser
    seed: bytes                    # the invite key's private half (secret)
    certificate: bytes             # organiser's signature over (run, invite id, invite key)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)


def _raw(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _certified(run: str, invite_id: bytes, invite_public: bytes) -> bytes:
    return run.encode() + b"\x00" + invite_id + invite_public


def issue(organiser: Ed25519PrivateKey, run: str) -> tuple[Invitation, str]:
    """A new invitation to `run` and its token."""
    invite_id, seed = secrets.token_bytes(INVITE_ID_BYTES), secrets.token_bytes(SEED_BYTES)
    invite_public = _raw(Ed25519PrivateKey.from_private_bytes(seed))
    certificate = sign("invite", _certified(run, invite_id, invite_public), organiser).signature
    raw = _raw(organiser) + invite_id + seed + certificate
    token = TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    return Invitation(invite_id.hex(), public_key_text(organiser), seed, certificate), token


def parse_token(token: str) -> Invitation:
    token = token.strip() if isinstance(token, str) else ""
    if not token.startswith(TOKEN_PREFIX):
        raise InvitationError(f"an invitation starts with {TOKEN_PREFIX!r} (skippipe-coordinator invite prints one)")
    body = token[len(TOKEN_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvitationError("the invitation is not valid base64 (copied incompletely?)") from None
    if len(raw) != _TOKEN_BYTES:
        raise InvitationError("the invitation has the wrong length (copied incompletely?)")
    organiser, rest = raw[:PUBLIC_KEY_BYTES], raw[PUBLIC_KEY_BYTES:]
    invite_id, seed, certificate = rest[:INVITE_ID_BYTES], rest[INVITE_ID_BYTES:-SIGNATURE_BYTES], rest[-SIGNATURE_BYTES:]
    return Invitation(invite_id.hex(), public_key_text_raw(organiser), seed, certificate)


def make_claim(invitation: Invitation, run: str, peer_id: str) -> bytes:
    """What the volunteer's advert carries: id, invite key, certificate, its signature on us."""
    key = invitation.private_key
    signature = key.sign(_CLAIM_DOMAIN + run.encode() + b"\x00" + peer_id.encode())
    return bytes.fromhex(invitation.invite_id) + _raw(key) + invitation.certificate + signature


def verify_claim(claim: bytes, run: str, peer_id: str, organiser_key: str) -> str | None:
    """The invitation id `claim` proves `peer_id` holds, under `organiser_key`; None if it proves nothing."""
    if not isinstance(claim, bytes) or len(claim) != CLAIM_BYTES or not organiser_key:
        return None
    invite_id = claim[:INVITE_ID_BYTES]
    invite_public = claim[INVITE_ID_BYTES:INVITE_ID_BYTES + PUBLIC_KEY_BYTES]
    certificate = claim[INVITE_ID_BYTES + PUBLIC_KEY_BYTES:-SIGNATURE_BYTES]
    signature = claim[-SIGNATURE_BYTES:]
    try:
        verify(SignedRecord("invite", _certified(run, invite_id, invite_public), organiser_key, certificate),
               organiser_key, "invite")
        Ed25519PublicKey.from_public_bytes(invite_public).verify(
            signature, _CLAIM_DOMAIN + run.encode() + b"\x00" + peer_id.encode())
    except (SignatureError, FieldError, InvalidSignature, ValueError):
        return None
    return invite_id.hex()


@dataclass(frozen=True)
class Roster:
    """Who the organiser admitted by invitation and who it banned; published signed ("roster")."""

    run: str
    version: int                                   # newer rosters have larger versions (ms clock)
    bindings: tuple[tuple[str, str], ...] = ()     # (invitation id, the peer id it is bound to)
    banned: tuple[str, ...] = ()                   # peer ids: no record, no route, no RPC
    revoked: tuple[str, ...] = ()                  # invitation ids no identity may use any more

    def __post_init__(self):
        if self.version < 0:
            raise FieldError("version", "must be >= 0")
        for name in ("bindings", "banned", "revoked"):
            if len(getattr(self, name)) > MAX_ROSTER_ENTRIES:
                raise FieldError(name, f"at most {MAX_ROSTER_ENTRIES} entries")
