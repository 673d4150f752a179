"""PipelineWorker: runs this peer's part of every iteration, in the schedule's order.

Per iteration i: (origin) enqueue the stage-0 forward of each own microbatch; then take ready
tasks from the inbox, lowest planned position first (forwards only while the activation stash
has room), compute them off the event loop, and send each result to the next hop. When every
task of i is done (or the iteration times out, which is reported), replicas of the stage
average their gradients, the optimizer steps, and the origin publishes an IterationReport.
"""
import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import torch

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.schedule import Phase, Schedule

from peer.compute import tensor_codec
from peer.compute.errors import ComputeError
from peer.compute.runner import StageRunner
from peer.pipeline import plan_view as pv
from peer.pipeline.averaging import ShareBox, combine, Contribution
from peer.pipeline.checkpoint import CheckpointStore
from peer.pipeline.inbox import Inbox
from peer.pipeline.schedule_book import ScheduleBook
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

logger = logging.getLogger(__name__)
RETRYABLE = {ErrorCode.OVERLOADED, ErrorCode.STALE_SCHEDULE}


@dataclass
class WorkerSettings:
    max_activations: int = 8
    rpc_timeout_s: float = 30.0
    iteration_timeout_s: float = 120.0
    send_deadline_s: float = 30.0


@dataclass
class IterationOutcome:
    iteration: int
    epoch: int
    stage: int
    completed: int = 0
    lost: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    stages_visited: int = 0
    started_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    timed_out: bool = False


BatchFn = Callable[[int, int, int, int], tuple[torch.Tensor, torch.Tensor]]
RunnerFactory = Callable[[int], StageRunner]


class PipelineWorker:
    def __init__(self, me: str, spec: m.RunSpec, rpc: RpcClient, book: ScheduleBook,
                 make_runner: RunnerFactory, batch: BatchFn, settings: WorkerSettings,
                 on_iteration: Callable[[IterationOutcome], Awaitable[None]] | None = None,
                 checkpoints: CheckpointStore | None = None, start_iteration: int = 0):
        self.me, self.spec, self.rpc, self.book = me, spec, rpc, book
        self.make_runner, self.batch, self.settings = make_runner, batch, settings
        self.on_iteration = on_iteration
        self.checkpoints = checkpoints
        self.iteration = start_iteration
        self.inbox = Inbox()
        self.shares = ShareBox()
        self.runner: StageRunner | None = None
        self.stage: int | None = None
        self.targets: dict[tuple[int, int], torch.Tensor] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self.history: list[IterationOutcome] = []
        self.finished = asyncio.Event()

    async def compute(self, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ---- the loop ----

    async def run(self) -> None:
        try:
            while True:
                schedule = await self._schedule_with_me()
                if self.spec.max_steps and self.iteration >= self.spec.max_steps:
                    break
                outcome = await self.run_iteration(self.iteration, schedule)
                self.history.append(outcome)
                if self.checkpoints is not None:
                    await self.compute(self.checkpoints.save, self.runner, self.stage, self.iteration)
                if self.on_iteration is not None:
                    await self.on_iteration(outcome)
                self.iteration += 1
        finally:
            self.finished.set()
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def _schedule_with_me(self) -> Schedule:
        """The schedule for the current iteration, waiting until one includes this peer."""
        while True:
            schedule = self.book.for_iteration(self.iteration)
            latest = self.book.latest
            if schedule is not None and self.me in schedule.stage_of():
                break
            if latest is not None and self.me in latest.stage_of() and latest.start_iteration > self.iteration:
                self.iteration = latest.start_iteration  # we join the run where it is now
                continue
            await self.book.wait_changed(timeout=5.0)
        stage = schedule.stage_of()[self.me]
        if stage != self.stage:
            if self.stage is not None:
                logger.warning("re-assigned from stage %d to %d: starting that stage afresh", self.stage, stage)
            self.runner = await self.compute(self.make_runner, stage)
            self.stage = stage
            if self.checkpoints is not None:
                done = await self.compute(self.checkpoints.load, self.runner, stage)
                if done is not None and done + 1 > self.iteration:
                    self.iteration = done + 1
                    return await self._schedule_with_me()
        return schedule

    async def run_iteration(self, i: int, schedule: Schedule) -> IterationOutcome:
        outcome = IterationOutcome(i, schedule.epoch, self.stage)
        pending = pv.expected_tasks(schedule, self.me)
        planned = pv.priorities(schedule, self.me)
        if self.runner.is_origin:
            await self._enqueue_origin_forwards(i, schedule)
        sends: list[asyncio.Task] = []
        deadline = time.monotonic() + self.settings.iteration_timeout_s

        def allowed(task: pv.TaskKey) -> bool:
            return task in pending and (not task.kind.is_forward
                                        or self.runner.stashed < self.settings.max_activations)

        while pending:
            got = await self.inbox.take(i, allowed, lambda t: pv.priority_of(t, planned),
                                        deadline - time.monotonic())
            if got is None:
                outcome.timed_out = True
                logger.error("iteration %d timed out with %d task(s) not done: %s", i, len(pending),
                             sorted((t.microbatch_id, t.kind.name) for t in pending)[:8])
                break
            task, payload = got
            pending.discard(task)
            route = schedule.route(task.microbatch_id)
            result = await self._run_task(i, route, task, payload, outcome)
            if result is not None:
                sends.append(asyncio.create_task(self._deliver(i, schedule, route, task, result)))
        if sends:
            await asyncio.gather(*sends)
        if self.runner.is_origin:
            outcome.lost = len(pv.origin_routes(schedule, self.me)) - outcome.completed
        await self._average_and_step(i, schedule, outcome)
        self.inbox.drop_before(i + 1)
        outcome.finished_at = time.time()
        return outcome

    async def _enqueue_origin_forwards(self, i: int, schedule: Schedule) -> None:
        shard, shards = pv.data_shard(schedule, self.me)
        for local, route in enumerate(pv.origin_routes(schedule, self.me)):
            tokens, targets = self.batch(i, local, shard, shards)
            self.targets[(i, route.microbatch_id)] = targets
            await self.inbox.put(i, pv.TaskKey(route.microbatch_id, pv.Kind.ORIGIN_FORWARD, 0), tokens)

    async def _run_task(self, i, route, task: pv.TaskKey, payload, outcome) -> torch.Tensor | None:
        key = (i, task.microbatch_id)
        r = self.runner
        try:
            if task.kind == pv.Kind.ORIGIN_FORWARD:
                return await self.compute(r.forward_origin, key, payload)
            if task.kind == pv.Kind.FORWARD:
                return await self.compute(r.forward, key, payload)
            if task.kind == pv.Kind.HEAD:
                loss, grad = await self.compute(r.head_loss, key, payload, self.targets.pop(key))
                outcome.loss_sum += loss * self.spec.microbatch_samples
                return grad
            if task.kind == pv.Kind.BACKWARD:
                return await self.compute(r.backward, key, payload)
            await self.compute(r.backward_origin, key, payload)
            outcome.completed += 1
            outcome.samples += self.spec.microbatch_samples
            outcome.stages_visited += len(route.hops)
            return None
        except ComputeError as exc:
            logger.error("microbatch %d: %s failed: %s", task.microbatch_id, task.kind.name, exc)
            r.drop(key)
            return None

    async def _deliver(self, i, schedule: Schedule, route, task: pv.TaskKey, tensor: torch.Tensor) -> None:
        dest = pv.destination(route, task)
        if dest is None:
            return
        header = m.WorkHeader(self.spec.run, schedule.epoch, i, route.microbatch_id, dest.hop_index)
        nxt = pv.task_for_request(route, dest.peer, dest.phase, dest.hop_index)
        if dest.peer == self.me:  # e.g. a route that visits stage 0 only
            await self.inbox.put(i, nxt, tensor)
            return
        payload = tensor_codec.encode(tensor)
        request = (m.ForwardRequest if dest.phase == Phase.FORWARD else m.BackwardRequest)(header, payload)
        await self.send_with_retries(dest.peer, request, f"microbatch {route.microbatch_id} {nxt.kind.name}")

    async def send_with_retries(self, peer: str, request, what: str) -> bool:
        """Deliver `request`, retrying back-pressure and transport errors (capped backoff)
        until `send_deadline_s` has passed; returns False (and logs why) if it never got in."""
        delay, attempts = 0.05, 0
        deadline = time.monotonic() + self.settings.send_deadline_s
        while True:
            attempts += 1
            try:
                await self.rpc.call(peer, request, self.settings.rpc_timeout_s)
                return True
            except RemoteError as exc:
                if exc.code not in RETRYABLE:
                    logger.error("%s rejected by %s: %s", what, peer[:12], exc)
                    return False
                problem = str(exc)
            except TransportError as exc:
                problem = str(exc)
            if time.monotonic() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        logger.error("%s: giving up on %s after %d attempts (%s)", what, peer[:12], attempts, problem)
        return False

    # ---- replica averaging ----

    async def _average_and_step(self, i: int, schedule: Schedule, outcome: IterationOutcome) -> None:
        r = self.runner
        others = [p for p in pv.replicas(schedule, self.stage) if p != self.me]
        mine = Contribution(await self.compute(r.grad_vector), r.samples_this_step, outcome.loss_sum)
        if others:
            share = m.GradientShare(self.spec.run, schedule.epoch, i, self.stage, mine.samples,
                                    tensor_codec.encode(mine.vector), mine.loss_sum)
            await asyncio.gather(*(self.send_with_retries(p, share, f"gradient share {i}") for p in others))
            # replicas may legitimately still be working: wait as long as an iteration may take
            got = await self.shares.collect(i, self.stage, set(others), self.settings.iteration_timeout_s)
            result = combine({**got, self.me: mine}, [self.me, *others])
            if result.missing:
                logger.warning("iteration %d: no gradients from replica(s) %s; averaging without them",
                               i, [p[:12] for p in result.missing])
            await self.compute(r.set_grad_vector, result.vector, result.samples)
        stats = await self.compute(r.step)
        logger.debug("iteration %d stage %d step: %s", i, self.stage, stats)
