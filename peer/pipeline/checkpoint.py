"""Per-stage checkpoints: parameters + optimizer state + the last finished iteration.

Replicas of a stage hold identical state after averaging, so one file per (run, stage) is
enough and any replica may write it (atomically: write a temp file, then rename).
"""
import logging
import os
from pathlib import Path

import torch

from peer.compute.runner import StageRunner

logger = logging.getLogger(__name__)


class CheckpointStore:
    def __init__(self, directory: Path, run: str):
        self.directory = Path(directory)
        self.run = run

    def path(self, stage: int) -> Path:
        return self.directory / f"{self.run}-stage{stage}.pt"

    def save(self, runner: StageRunner, stage: int, iteration: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(stage)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"iteration": iteration, "runner": runner.state_dict()}, tmp)
        os.replace(tmp, path)
        return path

    def load(self, runner: StageRunner, stage: int) -> int | None:
        """Load the stage's checkpoint into `runner`; returns its iteration, or None if absent."""
        path = self.path(stage)
        if not path.exists():
            return None
        try:
            # weights_only: a checkpoint file is data, never code
            state = torch.load(path, map_location="cpu", weights_only=True)
            runner.load_state_dict(state["runner"])
            iteration = int(state["iteration"])
        except Exception as exc:
            logger.error("cannot resume from %s (%s); starting this stage afresh", path, exc)
            return None
        logger.info("resumed stage %d from %s (iteration %d done)", stage, path, iteration)
        return iteration
