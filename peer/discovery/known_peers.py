"""Peers this peer has trained with, remembered in its cache folder, so that a restart can join
through them when its --initial-peers (usually the coordinator alone) do not answer: a peer
restarted while the coordinator is down, or refused by a busy bootstrap node (issue 25)."""
import json
import logging
import os
from pathlib import Path
from typing import Iterable

logger = logging.getLogger(__name__)
KEEP = 8                 # addresses remembered; joining needs one that answers
MAX_FILE_BYTES = 64 * 1024


def path_for(cache_dir: Path, run: str) -> Path:
    return Path(cache_dir) / f"known-peers-{run}.json"


def load(cache_dir: Path, run: str) -> list[str]:
    """The remembered addresses (none if the file is missing, too big or not ours)."""
    path = path_for(cache_dir, run)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return []
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [a for a in data if isinstance(a, str) and a.startswith("/") and "/p2p/" in a][:KEEP]


def save(cache_dir: Path, run: str, maddrs: Iterable[str], me: str) -> bool:
    """Remember up to KEEP full addresses of other peers (one per peer, loopback last), replacing
    the file atomically. Returns whether anything was written."""
    by_peer: dict[str, str] = {}
    for maddr in sorted(maddrs, key=lambda a: ("/127." in a or "/::1/" in a, a)):
        peer = maddr.rsplit("/p2p/", 1)[-1] if "/p2p/" in maddr else ""
        if peer and peer != me and peer not in by_peer:
            by_peer[peer] = maddr
    chosen = list(by_peer.values())[:KEEP]
    if not chosen:
        return False
    path = path_for(cache_dir, run)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(chosen))
        os.replace(tmp, path)
    except OSError as exc:   # a read-only cache costs only this fallback
        logger.debug("remembering peers failed: %s", exc)
        return False
    return True
