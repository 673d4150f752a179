"""PipelineWorker: runs this peer's part of every iteration, in the schedule's order.

Per iteration i: (origin) enqueue the stage-0 forward of each own microbatch; then take ready
tasks from the inbox, lowest planned position first (forwards only while the activation stash
has room), compute them off the event loop, and send each result to the next hop of the route
the microbatch actually takes. When a next hop fails, recovery (peer/pipeline/recovery.py)
reroutes, skips or re-issues the microbatch. An origin's iteration ends when each of its
microbatches has ended (completed, recovered or lost: never silently); it then tells every
peer (IterationDone). Other peers end the iteration once every live origin is done. Then the
replicas of each stage average their gradients, the optimizer steps, and the origin reports.
"""
import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import torch

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.schedule import Phase, Route, Schedule

from peer.compute import tensor_codec
from peer.compute.errors import ComputeError
from peer.compute.runner import StageRunner
from peer.pipeline import plan_view as pv
from peer.pipeline.averaging import ShareBox, ShareDeliveries, average_and_step
from peer.pipeline.checkpoint import CheckpointStore
from peer.pipeline.flights import Flight, IterationOutcome, IterationState, OriginEntry, Work
from peer.pipeline.inbox import Inbox
from peer.pipeline.recovery import Recovery
from peer.pipeline.schedule_book import BoundaryRead, ScheduleBook
from peer.pipeline.spot_checks import SpotChecks
from peer.pipeline import rejoin
from peer.pipeline.state_sync import StateDonor, fetch_state
from peer.routing.fallback import classify
from peer.routing.health import Health
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

from swarmcore.outcomes import Outcome
from tokendata.cursor import microbatch_positions, schedule_cursor

logger = logging.getLogger(__name__)
RETRYABLE = {ErrorCode.OVERLOADED, ErrorCode.STALE_SCHEDULE}
ORIGIN_GONE_AFTER_FAILURES = 8   # consecutive failed heartbeats (about 8 x heartbeat_s or more)


@dataclass
class WorkerSettings:
    max_activations: int = 8
    rpc_timeout_s: float = 30.0
    iteration_timeout_s: float = 120.0
    send_deadline_s: float = 30.0
    heartbeat_s: float = 0.5          # how often we check on peers that owe us work
    ping_timeout_s: float = 2.0
    extra_skips: int = 1              # recovery skip budget (k > 0 only), see routing/fallback.py
    spot_check_rate: float = 0.0      # share of forwards recomputed elsewhere, see spot_checks.py
    share_dtype: str = "int8"         # gradient shares on the wire (share_codec.py); float32: exact


# (iteration, local index, data shard, shards, global sample positions) -> (tokens, targets)
BatchFn = Callable[[int, int, int, int, list[int]], tuple[torch.Tensor, torch.Tensor]]
RunnerFactory = Callable[[int], StageRunner]


class PipelineWorker:
    def __init__(self, me: str, spec: m.RunSpec, rpc: RpcClient, book: ScheduleBook,
                 make_runner: RunnerFactory, batch: BatchFn, settings: WorkerSettings,
                 on_iteration: Callable[[IterationOutcome], Awaitable[None]] | None = None,
                 checkpoints: CheckpointStore | None = None, start_iteration: int = 0,
                 health: Health | None = None):
        self.me, self.spec, self.rpc, self.book = me, spec, rpc, book
        self.make_runner, self.batch, self.settings = make_runner, batch, settings
        self.on_iteration = on_iteration
        self.checkpoints = checkpoints
        self.iteration = start_iteration
        self.health = health or Health()
        self.inbox = Inbox()
        self.shares = ShareBox()
        self.deliveries = ShareDeliveries(
            lambda peer, share: self.send_with_retries(peer, share, f"gradient share {share.iteration}"), self.shares)
        self.runner: StageRunner | None = None
        self.stage: int | None = None
        self.targets: dict[tuple[int, int], torch.Tensor] = {}
        self.states: dict[int, IterationState] = {}
        self.current: Schedule | None = None          # the schedule of the running iteration
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self.history: list[IterationOutcome] = []
        self.finished = asyncio.Event()
        self.recovery = Recovery(self)
        self.donor = StateDonor(self)
        self.spot = SpotChecks(self, settings.spot_check_rate)
        self.stepped_iteration = start_iteration - 1   # the last iteration whose step is done
        self._background: set[asyncio.Task] = set()
        self.fault_hook: Callable[[int, str], None] | None = None   # chaos testing only
        self.slowdown = 1.0
        self.refresh_schedule: Callable[[], Awaitable[None]] | None = None
        self.boundary_read = BoundaryRead(lambda: self.refresh_schedule, self.spawn)
        self.isolation = rejoin.Isolation()            # set by peer/isolation.py

    async def compute(self, fn: Callable, *args) -> Any:
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        if self.slowdown > 1.0:  # an emulated slow device (chaos "stall"); the loop stays live
            await asyncio.sleep((self.slowdown - 1.0) * (time.monotonic() - started))
        return result

    def state(self, i: int) -> IterationState:
        return self.states.setdefault(i, IterationState(i))

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ---- the loop ----

    async def run(self) -> None:
        monitor = asyncio.create_task(self.recovery.monitor())
        try:
            while True:
                await self.boundary_read.finish()
                schedule = await self._schedule_with_me()
                if self.spec.max_steps and self.iteration >= self.spec.max_steps:
                    await self.deliveries.flush(self.settings.send_deadline_s)
                    break
                outcome = await rejoin.unless_cut_off(self, self.run_iteration(self.iteration, schedule))
                if outcome is None:
                    await rejoin.sit_out(self, self.iteration)
                    continue
                self.history.append(outcome)
                if self.checkpoints is not None and self.checkpoints.due(self.iteration, self.spec.max_steps):
                    # only the snapshot is on the compute thread; a writer thread does the disk
                    await self.compute(self.checkpoints.snapshot, self.runner, self.stage, self.iteration,
                                       self._data_cursor_after(schedule, self.iteration))
                if self.on_iteration is not None:
                    await self.on_iteration(outcome)
                self.iteration += 1
        finally:
            monitor.cancel()
            if self.checkpoints is not None and not self.checkpoints.flush(timeout_s=60):
                logger.error("the last checkpoint was still being written at shutdown")
            for task in list(self._background):
                task.cancel()
            self.deliveries.cancel()
            self.finished.set()
            self.executor.shutdown(wait=False, cancel_futures=True)

    def _data_cursor_after(self, schedule: Schedule, i: int) -> dict | None:
        """Stage 0's checkpoints carry where the sample cursor stands after iteration i."""
        if not self.runner.is_origin:
            return None
        base, retry = schedule_cursor(schedule, self.spec.microbatch_samples).at(i + 1)
        return {"iteration": i + 1, "base": base, "retry": list(retry), "dataset_id": self.spec.dataset_id}

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
            done = None
            if self.checkpoints is not None:
                done = await self.compute(self.checkpoints.load, self.runner, stage)
                if done is not None and done + 1 > self.iteration:
                    self.iteration = self.stepped_iteration = done + 1
                    self.stepped_iteration -= 1
                    return await self._schedule_with_me()
            # a checkpoint of the iteration just before this one is the stage's current state
            # (a resumed run re-partitions before anyone trains: every replica of the stage may
            # be new to it, and asking each other would only wait out the timeout)
            current = done is not None and done + 1 == self.iteration
            if self.iteration > 0 and not current and len(pv.replicas(schedule, stage)) > 1:
                await fetch_state(self, schedule, stage)  # late join: same state as the replicas
            self.stepped_iteration = self.iteration - 1
        return schedule

    def iteration_over(self, st: IterationState, schedule: Schedule) -> bool:
        if self.runner.is_origin:
            return not st.unresolved()
        # a slow origin is not a dead one: ending early would lose its microbatches, so only
        # a departure (advert gone) or a long silence counts
        h = self.health
        return all(o in st.done_origins or (o in h.departed and h.failures(o) >= h.suspect_after)
                   or h.failures(o) >= ORIGIN_GONE_AFTER_FAILURES for o in pv.replicas(schedule, 0))

    async def run_iteration(self, i: int, schedule: Schedule) -> IterationOutcome:
        self.current = schedule
        self.spot.begin_iteration(i, self.runner)
        if self.fault_hook is not None:
            self.fault_hook(i, "START")
        st = self.state(i)
        outcome = IterationOutcome(i, schedule.epoch, self.stage)
        planned = pv.priorities(schedule, self.me)
        if self.runner.is_origin:
            await self._enqueue_origin_forwards(i, schedule, st)
        deadline = time.monotonic() + self.settings.iteration_timeout_s

        def allowed(task: pv.TaskKey) -> bool:
            return not task.kind.is_forward or self.runner.stashed < self.settings.max_activations

        while not self.iteration_over(st, schedule):
            left = deadline - time.monotonic()
            if left <= 0:
                outcome.timed_out = True
                self._give_up(i, st)
                break
            got = await self.inbox.take(i, allowed, lambda t: pv.priority_of(t, planned), min(left, 0.25))
            if got is not None:
                await self._run_task(i, schedule, st, got[0], got[1], outcome)
        self.boundary_read.start()   # overlaps the exchange below
        if self.runner.is_origin:
            await self._announce_done(i, schedule, st)
        outcome.counts = st.counts()
        outcome.lost_microbatches = sorted(mb for mb, e in st.own.items() if e.outcome == Outcome.LOST)
        await average_and_step(self, i, schedule, outcome)
        self.stepped_iteration = i
        self.end_iteration(i)
        outcome.finished_at = time.time()
        return outcome

    def _give_up(self, i: int, st: IterationState) -> None:
        left = st.unresolved()
        if self.runner.is_origin:
            for mb in left:
                st.own[mb].outcome = Outcome.LOST
            logger.error("iteration %d timed out: microbatch(es) %s LOST (not counted in the gradient)", i, left)
        else:
            missing = sorted(set(pv.replicas(self.current, 0)) - st.done_origins)
            logger.error("iteration %d timed out waiting for origin(s) %s", i, [p[:12] for p in missing])

    def end_iteration(self, i: int) -> None:
        self.inbox.drop_before(i + 1)
        for key in [k for k in self.targets if k[0] <= i]:
            del self.targets[key]
        for old in [k for k in self.states if k <= i]:
            del self.states[old]

    async def _enqueue_origin_forwards(self, i: int, schedule: Schedule, st: IterationState) -> None:
        shard, shards = pv.data_shard(schedule, self.me)
        for local, route in enumerate(pv.origin_routes(schedule, self.me)):
            positions = microbatch_positions(schedule, self.spec.microbatch_samples, i, route.microbatch_id)
            tokens, targets = self.batch(i, local, shard, shards, positions)
            self.targets[(i, route.microbatch_id)] = targets
            st.own[route.microbatch_id] = OriginEntry(route, positions=tuple(positions))
            await self.inbox.put(i, pv.TaskKey(route.microbatch_id, pv.Kind.ORIGIN_FORWARD, 0),
                                 Work(tokens, route, 0, self.me))

    # ---- one task ----

    async def _run_task(self, i: int, schedule: Schedule, st: IterationState, task: pv.TaskKey,
                        work: Work, outcome: IterationOutcome) -> None:
        key, mb, r = (i, task.microbatch_id), task.microbatch_id, self.runner
        if self.fault_hook is not None:
            self.fault_hook(i, task.kind.name)
        if task.kind in (pv.Kind.BACKWARD, pv.Kind.ORIGIN_BACKWARD):
            why = st.expects_backward(mb, work.attempt, work.sender)
            if why is not None:
                logger.debug("dropping a backward: %s", why)
                return
        try:
            if task.kind == pv.Kind.ORIGIN_FORWARD:
                out = await self.compute(r.forward_origin, key, work.tensor)
                self._fly(st, work.route, 0, 0)
                self.spawn(self.send_output(i, schedule, work.route, task, out, 0))
            elif task.kind == pv.Kind.FORWARD:
                r.drop(key)  # an older attempt's activations, superseded by this one
                out = await self.compute(r.forward, key, work.tensor)
                self._fly(st, work.route, task.hop_index, work.attempt)
                self.spawn(self.send_output(i, schedule, work.route, task, out, work.attempt))
            elif task.kind == pv.Kind.HEAD:
                await self._head(i, schedule, st, task, work)
            elif task.kind == pv.Kind.BACKWARD:
                flight = st.flights.pop(mb)
                grad = await self.compute(r.backward, key, work.tensor, mb not in st.counted)
                st.counted.add(mb)
                self.spawn(self.send_output(i, schedule, flight.route, task, grad, flight.upstream_attempt))
            else:
                await self._origin_backward(i, st, mb, work, outcome)
        except ComputeError as exc:
            logger.error("microbatch %d: %s failed: %s", mb, task.kind.name, exc)
            r.drop(key)
            st.flights.pop(mb, None)
            await self.recovery.compute_failed(i, schedule, st, mb, work, str(exc))

    def _fly(self, st: IterationState, route: Route, hop: int, attempt: int) -> None:
        st.flights[route.microbatch_id] = Flight(route, hop, attempt, pv.next_hop(route, hop), upstream_attempt=attempt)

    async def _head(self, i: int, schedule: Schedule, st: IterationState, task: pv.TaskKey, work: Work) -> None:
        mb = task.microbatch_id
        entry = st.own[mb]
        loss, grad = await self.compute(self.runner.head_loss, (i, mb), work.tensor,
                                        self.targets[(i, mb)], entry.head_attempt >= 0)
        entry.head_route, entry.head_attempt = work.route, work.attempt
        entry.loss_sum = loss * self.spec.microbatch_samples
        self.spawn(self.send_output(i, schedule, work.route, task, grad, work.attempt))

    async def _origin_backward(self, i: int, st: IterationState, mb: int, work: Work,
                               outcome: IterationOutcome) -> None:
        st.flights.pop(mb)
        entry = st.own[mb]
        await self.compute(self.runner.backward_origin, (i, mb), work.tensor)
        entry.outcome = classify(entry.planned, entry.head_route, entry.reissued)
        outcome.loss_sum += entry.loss_sum
        outcome.samples += self.spec.microbatch_samples
        outcome.positions.extend(entry.positions)
        outcome.stages_visited += len(entry.head_route.hops)
        if entry.outcome != Outcome.COMPLETED:
            logger.info("iteration %d microbatch %d %s via %s", i, mb, entry.outcome,
                        [(h.stage, h.peer[:8]) for h in entry.head_route.hops])

    # ---- sending ----

    async def send_output(self, i: int, schedule: Schedule, route: Route, task: pv.TaskKey,
                          tensor: torch.Tensor, attempt: int) -> None:
        """Send a task's result to the next hop of `route`; a forward that cannot be
        delivered goes to recovery."""
        dest = pv.destination(route, task)
        if dest is None:
            return
        mb = route.microbatch_id
        nxt = pv.task_for_request(route, dest.peer, dest.phase, dest.hop_index)
        if dest.peer == self.me:  # e.g. a route that visits stage 0 only
            await self.inbox.put(i, nxt, Work(tensor, route, attempt, self.me))
            return
        planned = schedule.route(mb)
        header = m.WorkHeader(self.spec.run, schedule.epoch, i, mb, dest.hop_index, attempt,
                              None if route == planned else route)
        # a forward to a middle hop can go elsewhere; the head (at the origin) and backwards
        # cannot, so those keep trying a suspect peer until the send deadline
        recoverable = dest.phase == Phase.FORWARD and dest.hop_index < len(route.hops)
        if recoverable and self.health.suspect(dest.peer):
            ok = False  # known dead: do not wait for it to fail again
        else:
            payload = tensor_codec.encode(tensor)
            request = (m.ForwardRequest if dest.phase == Phase.FORWARD else m.BackwardRequest)(header, payload)
            self.spot.maybe_check(schedule, route, request, dest.peer)  # sampled: recomputed elsewhere
            ok = await self.send_with_retries(dest.peer, request, f"microbatch {mb} {nxt.kind.name}",
                                              give_up_when_suspect=recoverable)
        if not ok and recoverable:
            await self.recovery.next_hop_failed(i, mb, dest.peer)

    async def send_with_retries(self, peer: str, request, what: str, deadline_s: float | None = None,
                                give_up_when_suspect: bool = True) -> bool:
        """Deliver `request`, retrying back-pressure and transport errors (capped backoff)
        until the deadline (or until `peer` is suspect, when there is somewhere else to go);
        False (logged) if it never got in."""
        delay, attempts = 0.05, 0
        deadline = time.monotonic() + (deadline_s or self.settings.send_deadline_s)
        while True:
            attempts += 1
            try:
                await self.rpc.call(peer, request, self.settings.rpc_timeout_s)
                self.health.record_success(peer)
                return True
            except RemoteError as exc:
                if exc.code == ErrorCode.DUPLICATE:
                    return True  # an earlier try got through
                if exc.code not in RETRYABLE:
                    logger.warning("%s rejected by %s: %s", what, peer[:12], exc)
                    return False
                problem = str(exc)
            except TransportError as exc:
                problem = str(exc)
                self.health.record_failure(peer, self._replicas_of_peer(peer))
            gone = peer in self.health.departed or (give_up_when_suspect and self.health.suspect(peer))
            if gone or time.monotonic() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        logger.warning("%s: giving up on %s after %d attempt(s) (%s)", what, peer[:12], attempts, problem)
        return False

    def _replicas_of_peer(self, peer: str) -> list[str]:
        schedule = self.current
        if schedule is None or peer not in schedule.stage_of():
            return []
        return pv.replicas(schedule, schedule.stage_of()[peer])

    async def _announce_done(self, i: int, schedule: Schedule, st: IterationState) -> None:
        done = m.IterationDone(self.spec.run, schedule.epoch, i, m.MicrobatchCounts(**st.counts()))
        others = [p for p in schedule.stage_of() if p != self.me and p not in self.health.departed]
        for peer in others:  # in the background; a peer that misses it would wait the iteration out
            self.spawn(self.send_with_retries(peer, done, f"iteration {i} done", give_up_when_suspect=False))
