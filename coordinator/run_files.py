"""The files and keys a coordinator takes or leaves at start: its join key, its organiser key
and the --maddrs-file peers read its addresses from."""
import logging
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.membership import JoinKeyError, create_join_key, load_join_key
from protocol.signing import public_key_text

from coordinator.organiser_key import load_or_create_organiser_key

logger = logging.getLogger("skippipe.coordinator")


def load_or_create_join_key(path: str) -> bytes:
    try:
        create_join_key(path)
        logger.info("created join key %s: give it (securely) to the peers you admit (--join-key)", path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise JoinKeyError(f"cannot create join key file {path}: {exc.strerror}") from None
    return load_join_key(path)


def write_maddrs_file(path: str, maddrs: list[str]) -> None:
    tmp = Path(path).with_suffix(".tmp")
    try:
        tmp.write_text(" ".join(maddrs) + "\n")
        tmp.replace(path)  # atomic: a reader never sees half a line
    except OSError as exc:
        logger.error("cannot write --maddrs-file %s: %s; peers must be given the addresses above by hand",
                     path, exc.strerror)


def remove_stale_maddrs_file(path: str) -> None:
    try:
        Path(path).unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove the old --maddrs-file %s (%s): peers may read a dead address until "
                       "it is rewritten", path, exc.strerror)


def load_organiser(path: str) -> Ed25519PrivateKey:
    """The organiser key from `path` (created there if missing), or a new one for this start."""
    if not path:
        logger.warning("the organiser key is new for this start: peers that pinned the previous one will not "
                       "follow a restarted coordinator (keep one with --organiser-key FILE)")
        return Ed25519PrivateKey.generate()
    key, created = load_or_create_organiser_key(path)
    logger.info("%s organiser key %s (%s)", "created" if created else "loaded", path, public_key_text(key))
    return key
