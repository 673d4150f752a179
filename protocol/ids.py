"""Typed identifiers and the DHT key builders (keys embed the major version and run name)."""
import re

from protocol.errors import FieldError
from protocol.version import PROTOCOL_MAJOR

PeerId = str  # base58 libp2p peer id as a string (hivemind's PeerID.to_base58())
MicrobatchId = int

_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_run_name(name: str) -> str:
    if not isinstance(name, str) or not _RUN_NAME.fullmatch(name):
        raise FieldError("run", f"invalid run name {name!r}: use 1-64 letters, digits, '_', '.', '-'")
    return name


def _key(run: str, what: str) -> str:
    return f"skippipe/v{PROTOCOL_MAJOR}/{check_run_name(run)}/{what}"


def spec_key(run: str) -> str:
    return _key(run, "spec")


def peers_key(run: str) -> str:
    return _key(run, "peers")


def links_key(run: str) -> str:
    return _key(run, "links")


def schedule_key(run: str) -> str:
    return _key(run, "schedule")


def previous_schedule_key(run: str) -> str:
    """The schedule before the current one: a restarted coordinator accounts the iterations
    that ran under it (the current one may start ahead of the swarm)."""
    return _key(run, "schedule_previous")


def superseded_schedule_key(run: str) -> str:
    """The schedule published just before the current one (when it is not the previous one):
    a peer that was stopped while it was current reads it on finding an epoch gap."""
    return _key(run, "schedule_superseded")


def progress_key(run: str) -> str:
    return _key(run, "progress")


def spot_checks_key(run: str) -> str:
    return _key(run, "spot_checks")


def roster_key(run: str) -> str:
    """The organiser's signed Roster (protocol/invitations.py)."""
    return _key(run, "roster")
