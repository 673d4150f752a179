"""Per-stage checkpoints, saved off the training loop's critical path.

Replicas of a stage hold identical state after averaging, so one version per (run, stage,
iteration) is enough and any replica may write it. The loop only takes a snapshot (a copy of
the runner's tensors, on the compute thread, so no step can interleave); a writer thread
turns it into safetensors + optimizer files (peer/compute/stage_checkpoint.py). If the writer
is still busy when the next snapshot comes, the newer one replaces the one waiting: the disk
never holds back training. flush() waits for the last one (at the end of a run).

--save-every N saves after every N-th iteration (and the run's last); --keep-last K keeps the
K newest versions of each stage.
"""
import logging
import threading
from pathlib import Path

from peer.compute import stage_checkpoint as sc
from peer.compute.runner import StageRunner

logger = logging.getLogger(__name__)


class CheckpointStore:
    def __init__(self, directory: Path, run: str, save_every: int = 1, keep_last: int = 2,
                 tokenizer: tuple[str, str] = ("byte", "")):
        if save_every < 1 or keep_last < 1:
            raise ValueError("save_every and keep_last must be >= 1")
        self.tokenizer = tokenizer             # (name, hash) of the run's: export defaults to it
        self.directory = Path(directory)
        self.run, self.save_every, self.keep_last = run, save_every, keep_last
        self._cond = threading.Condition()
        self._next: tuple | None = None        # (config, state, iteration) waiting for the writer
        self._busy = False
        self._thread: threading.Thread | None = None
        self.written: list[Path] = []

    def due(self, iteration: int, max_steps: int = 0) -> bool:
        return (iteration + 1) % self.save_every == 0 or (max_steps > 0 and iteration == max_steps - 1)

    # ---- saving ----

    def snapshot(self, runner: StageRunner, stage: int, iteration: int, data_cursor: dict | None = None) -> None:
        """Copy the runner's state now (compute thread) and hand it to the writer thread;
        `data_cursor` (stage 0): the sample cursor after `iteration`, saved next to it."""
        state = runner.state_dict()            # a deep copy: training goes on meanwhile
        with self._cond:
            if self._next is not None:
                logger.info("checkpoint of iteration %d skipped: the disk is slower than training",
                            self._next[2])
            self._next = (runner.config, state, iteration, data_cursor)
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="checkpoint-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def save(self, runner: StageRunner, stage: int, iteration: int) -> Path:
        """Synchronous save (tests, tools): snapshot, then wait until it is on disk."""
        self.snapshot(runner, stage, iteration)
        self.flush()
        return sc.version_dir(self.directory, self.run, stage, iteration)

    def flush(self, timeout_s: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._next is None and not self._busy, timeout_s)

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._next is not None)
                config, state, iteration, data_cursor = self._next
                self._next, self._busy = None, True
            try:
                path = sc.write_version(self.directory, self.run, config, state, iteration, self.tokenizer,
                                        data_cursor)
                sc.prune(self.directory, self.run, state["stage"], self.keep_last)
                if path is not None:
                    self.written.append(path)
                    logger.debug("checkpoint written: %s", path)
            except Exception as exc:          # a full disk must not stop training; say so loudly
                logger.error("cannot write the checkpoint of iteration %d to %s: %s", iteration,
                             self.directory, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    # ---- resuming ----

    def load(self, runner: StageRunner, stage: int) -> int | None:
        """Load the stage's newest usable checkpoint into `runner`; its iteration, or None."""
        candidates = sc.versions(self.directory, self.run, stage)[::-1]
        legacy = sc.legacy_file(self.directory, self.run, stage)
        if legacy is not None:
            candidates.append(legacy)
        for f in candidates:
            try:
                state = sc.read_runner_state(f)
                iteration = f.iteration if not f.legacy else int(sc.read_legacy(f.path)["iteration"])
                runner.load_state_dict(state)
            except (sc.CheckpointError, ValueError, RuntimeError) as exc:
                logger.error("cannot resume from %s (%s); trying an older one", f.path, exc)
                continue
            logger.info("resumed stage %d from %s (iteration %d done)", stage, f.path, iteration)
            return iteration
        if candidates:
            logger.error("no usable checkpoint of stage %d in %s; starting this stage afresh", stage, self.directory)
        return None
