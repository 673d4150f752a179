"""The stage this peer hosts: its runner, the one compute thread it runs on, its checkpoints,
and how far its parameters have stepped. The worker, averaging, state sync, rejoin and spot
checks compute through it; none of them needs the worker for that."""
import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from peer.compute.runner import StageRunner
from peer.pipeline.checkpoint import CheckpointStore
from peer.pipeline.speed_meter import SpeedMeter, probe_forward, stage_layers

logger = logging.getLogger(__name__)
RunnerFactory = Callable[[int], StageRunner]


class StageSeat:
    def __init__(self, make_runner: RunnerFactory, checkpoints: CheckpointStore | None = None,
                 slowdown: float = 1.0):
        self.make_runner = make_runner
        self.checkpoints = checkpoints
        self.slowdown = slowdown              # an emulated slower device: compute takes x slowdown
        self.runner: StageRunner | None = None
        self.stage: int | None = None
        self.stepped_iteration = -1           # the last iteration whose step is done
        self.pending_iteration: int | None = None   # delayed updates: the one whose average is in flight
        self.stepping = False                 # an averaged update is being applied right now
        self.fetching_state = False           # copying the stage's state from a replica: none to give
        self.stale_starts = 0                 # stages taken mid-run without their current state
        self.speed = SpeedMeter()             # measured forward speed, advertised (speed_meter.py)
        # one thread: compute stays off the event loop (heartbeats keep flowing) and in order
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")

    async def compute(self, fn: Callable, *args) -> Any:
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        if self.slowdown > 1.0:  # an emulated slow device (chaos "stall"); the loop stays live
            await asyncio.sleep((self.slowdown - 1.0) * (time.monotonic() - started))
        return result

    def trains_iteration(self) -> int:
        """The iteration the parameters are for: the one after the last update applied, or
        (delayed updates) after the one pending."""
        last = self.stepped_iteration if self.pending_iteration is None else self.pending_iteration
        return last + 1

    async def forward(self, fn: Callable, key, tensor) -> Any:
        """A forward of this stage, timed for the speed meter: its compute (times an emulated
        slowdown), not its wait for the compute thread, which says more of our schedule than
        of this machine."""
        took = []

        def timed(*args):
            started = time.monotonic()
            try:
                return fn(*args)
            finally:
                took.append(time.monotonic() - started)
        out = await self.compute(timed, key, tensor)
        self.speed.observe(took[0] * self.slowdown, stage_layers(self.runner), tensor.shape[0])
        return out

    async def probe_speed(self, samples: int, seq_len: int) -> None:
        """Time a probe forward when no real one came for a while (a demoted peer's way back)."""
        if self.runner is None or not self.speed.probe_due():
            return
        started = time.monotonic()
        if await self.compute(probe_forward, self.runner, samples, seq_len):
            self.speed.observe((time.monotonic() - started), stage_layers(self.runner), samples)

    def set_slowdown(self, factor: float) -> None:
        self.slowdown = factor

    async def take(self, stage: int) -> int | None:
        """Host `stage` afresh; the iteration its checkpoint finished (None: no checkpoint)."""
        self.runner = await self.compute(self.make_runner, stage)
        self.stage = stage
        if self.checkpoints is None:
            return None
        return await self.compute(self.checkpoints.load, self.runner, stage)

    def note_stale_start(self, stage: int, iteration: int, checkpoint: int | None) -> None:
        """We host `stage` from `iteration` on without its current state (no live replica gave it):
        loudly, because what the stage learned since is lost (issue 25: this once happened silently)."""
        self.stale_starts += 1
        if checkpoint is None:
            logger.error("stage %d starts from FRESH weights at iteration %d: no live replica gave its state and "
                         "no checkpoint of it is here (--checkpoint-dir); what it had learned is lost",
                         stage, iteration)
        else:
            logger.error("stage %d resumes at iteration %d from its checkpoint of iteration %d: no live replica gave "
                         "its current state; what it learned in between is lost", stage, iteration, checkpoint)

    async def checkpoint(self, iteration: int, data_cursor: dict | None) -> None:
        """Save after `iteration` if one is due: only the snapshot is on the compute thread, a
        writer thread does the disk."""
        await self.compute(self.checkpoints.snapshot, self.runner, self.stage, iteration, data_cursor)

    def close(self) -> None:
        if self.checkpoints is not None and not self.checkpoints.flush(timeout_s=60):
            logger.error("the last checkpoint was still being written at shutdown")
        self.executor.shutdown(wait=False, cancel_futures=True)
