"""Run membership by a shared join key (HMAC-SHA256), pure stdlib.

Decision (issue 7): a join key, not an allowlist. The run's operator creates a secret file and
hands it to the volunteers it admits; a member publishes `proof = HMAC(key, run, peer_id)` in
its advert. The proof is public but useless to copy: it names one peer id, and that peer id is
bound to an RSA key (libp2p identity = DHT owner key, see protocol/owner.py), so only the holder
of that private key can sign adverts or open libp2p streams as it. Admitting someone new needs
no coordinator round-trip; revoking one member means rotating the key (documented limit).
"""
import hashlib
import hmac
import os
import secrets
from pathlib import Path

MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096
_DOMAIN = b"skippipe-member/v1\x00"


class JoinKeyError(ValueError):
    """The join key file is missing, unreadable, too short or unsafe (the message says which)."""


def load_join_key(path: str | os.PathLike) -> bytes:
    path = Path(path)
    try:
        if path.stat().st_mode & 0o077:
            raise JoinKeyError(f"join key file {path} is readable by other users; run: chmod 600 {path}")
        data = path.read_bytes()[:MAX_KEY_BYTES + 1].strip()
    except OSError as exc:
        raise JoinKeyError(f"cannot read join key file {path}: {exc.strerror}") from None
    if len(data) < MIN_KEY_BYTES or len(data) > MAX_KEY_BYTES:
        raise JoinKeyError(f"join key file {path} must hold {MIN_KEY_BYTES}-{MAX_KEY_BYTES} bytes "
                           f"(create one with: skippipe-coordinator --join-key {path} ...)")
    return data


def create_join_key(path: str | os.PathLike) -> bytes:
    """Write a fresh random key (hex, mode 0600); refuses to overwrite an existing file."""
    key = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key


def member_proof(key: bytes, run: str, peer_id: str) -> bytes:
    message = _DOMAIN + run.encode() + b"\x00" + peer_id.encode()
    return hmac.new(key, message, hashlib.sha256).digest()


def is_member(key: bytes, run: str, peer_id: str, proof: bytes) -> bool:
    return isinstance(proof, bytes) and hmac.compare_digest(member_proof(key, run, peer_id), proof)
