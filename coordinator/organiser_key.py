"""The organiser's signing key file (issue 24): the private half of the key peers pin with
`--run NAME@KEY`. Created on first use (PEM, PKCS#8, mode 0600, never overwritten) and
refused when other users can read it. Whoever holds this file controls the run: a coordinator
restarted with it takes the run back; a new file means a new key, which peers must be told
(docs: moving a run to a new key)."""
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.signing import public_key_text

MAX_KEY_FILE_BYTES = 4096


class OrganiserKeyError(Exception):
    """The key file cannot be used; the message says why and what to do."""


def load_or_create_organiser_key(path: str | os.PathLike) -> tuple[Ed25519PrivateKey, bool]:
    """(the key, whether it was created now)."""
    path = Path(path)
    created = False
    if not path.exists():
        _create(path)
        created = True
    try:
        if path.stat().st_mode & 0o077:
            raise OrganiserKeyError(f"organiser key file {path} is readable by other users; run: chmod 600 {path}")
        data = path.read_bytes()[:MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise OrganiserKeyError(f"cannot read organiser key file {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise OrganiserKeyError(f"{path} is not an Ed25519 organiser key (PEM); move it away to create a new one "
                                f"(peers would then need the new key)")
    return key, created


def _create(path: Path) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return                                   # created by a concurrent start: load that one
    except OSError as exc:
        raise OrganiserKeyError(f"cannot create organiser key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def run_address(run: str, key: Ed25519PrivateKey) -> str:
    """What peers pass to --run: the run's name and the key they pin."""
    return f"{run}@{public_key_text(key)}"
