"""A peer's persistent identity: one RSA key file that is both its libp2p identity (the peer id)
and the owner key that signs its DHT records (hivemind's RSASignatureValidator).

The file is created with mode 0600 and refused if others can read it. While a peer runs it holds
an exclusive lock on the file, so a second peer on this machine with the same file is refused at
once; hivemind's own check (P2P.create with identity_path) catches the same identity elsewhere in
the swarm. Both end with a DuplicateIdentity that says what to do.
"""
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey


class IdentityError(Exception):
    """The identity file cannot be used (the message says why and what to do)."""


class DuplicateIdentity(IdentityError):
    pass


@dataclass
class Identity:
    path: Path
    private_key: RSAPrivateKey
    peer_id: str
    _lock_fd: int | None = None

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def duplicate_message(path: Path, peer_id: str, where: str) -> str:
    return (f"identity {path} (peer id {peer_id}) is already in use by another peer {where}; "
            f"each peer needs its own --identity file (a missing file is created)")


def load_identity(path: str | os.PathLike) -> Identity:
    """Load the key at `path`, creating it (0600) if missing, and lock it for this process."""
    path = Path(path)
    if not path.exists():
        _create(path)
    mode = path.stat().st_mode
    if mode & 0o077:
        raise IdentityError(f"identity file {path} is readable by other users (mode {mode & 0o777:o}); "
                            f"run: chmod 600 {path}")
    data = path.read_bytes()
    try:
        der = crypto_pb2.PrivateKey.FromString(data).data
        key = serialization.load_der_private_key(der, password=None)
        peer_id = PeerID.from_identity(data).to_base58()
    except Exception as exc:
        raise IdentityError(f"identity file {path} is not a libp2p RSA private key ({type(exc).__name__}); "
                            f"move it away to create a new identity") from None
    private_key = RSAPrivateKey.__new__(RSAPrivateKey)
    private_key._private_key = key  # hivemind's class has no public from-bytes constructor
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DuplicateIdentity(duplicate_message(path, peer_id, "on this machine")) from None
    return Identity(path, private_key, peer_id, fd)


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = RSAPrivateKey()
    blob = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # created by a concurrent start: the lock decides who may use it
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
