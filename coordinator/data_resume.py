"""Where the sample cursor stood at the newest stage-0 checkpoint, so that a coordinator that
starts afresh (no schedule left in the DHT) continues the data epoch instead of training its
first samples again. Stage-0 peers write `data_cursor.json` next to each checkpoint version
(peer/compute/stage_checkpoint.py); the coordinator reads it when it can see that folder
(`--checkpoint-dir`, as in skippipe-swarm)."""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("skippipe.coordinator")
DATA_CURSOR = "data_cursor.json"
_VERSION = re.compile(r"^it\d{8,}$")


@dataclass(frozen=True)
class SavedCursor:
    iteration: int                  # the first iteration not yet trained
    base: int
    retry: tuple[int, ...]


def saved_cursor(checkpoint_dir: str | Path, run: str, dataset_id: str) -> SavedCursor | None:
    """The cursor of the newest stage-0 checkpoint of `run`, or None (none, unreadable, or
    saved for another dataset: each said in the log)."""
    folder = Path(checkpoint_dir) / f"{run}-stage0"
    versions = sorted(p for p in folder.glob("it*") if _VERSION.match(p.name) and (p / DATA_CURSOR).is_file()) \
        if folder.is_dir() else []
    if not versions:
        return None
    path = versions[-1] / DATA_CURSOR
    try:
        d = json.loads(path.read_text())
        cursor = SavedCursor(int(d["iteration"]), int(d["base"]), tuple(int(p) for p in d["retry"]))
        saved_for = str(d.get("dataset_id", ""))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring %s (%s): the data cursor starts afresh", path, exc)
        return None
    if cursor.iteration < 0 or cursor.base < 0 or min(cursor.retry, default=0) < 0:
        logger.warning("ignoring %s: negative positions", path)
        return None
    if saved_for != dataset_id:
        logger.warning("ignoring %s: saved for dataset %r, this run trains on %r", path, saved_for or "corpus",
                       dataset_id or "corpus")
        return None
    logger.info("continuing the data cursor of %s: iteration %d, next sample %d, %d to train again", path,
                cursor.iteration, cursor.base, len(cursor.retry))
    return cursor
