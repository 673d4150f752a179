"""PipelineWorker: runs this peer's part of every iteration, in the schedule's order.

Per iteration i: (origin) enqueue the stage-0 forward of each own microbatch; then take ready
tasks from the inbox, lowest planned position first (forwards only while the activation stash
has room), compute them off the event loop, and send each result to the next hop of the route
the microbatch actually takes. When a next hop fails, recovery (peer/pipeline/recovery.py)
reroutes, skips or re-issues the microbatch. An origin's iteration ends when each of its
microbatches has ended (completed, recovered or lost: never silently); it then tells every
peer (IterationDone). Other peers end the iteration once every live origin is done. Then the
replicas of each stage average their gradients, the optimizer steps, and the origin reports.

The loop owns the order of work; the rest lives in parts it hands each other at construction
(seat.py, ledger.py, sender.py, recovery.py, averaging.py, rejoin.py, state_sync.py,
spot_checks.py), and none of them calls back up into the loop.
"""
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import torch

from opsweb.lifecycle import Lifecycle

from protocol import messages as m
from protocol.schedule import Route, Schedule
from protocol.spot_checks import SpotCheckRecord

from peer.compute.errors import ComputeError
from peer.pipeline import plan_view as pv
from peer.pipeline.averaging import GradientExchange
from peer.pipeline.flights import Flight, IterationOutcome, IterationState, OriginEntry, Work
from peer.pipeline.inbox import Inbox
from peer.pipeline.lagging_origins import LaggingOrigins, ProgressReader
from peer.pipeline.ledger import Ledger
from peer.pipeline.recovery import Recovery
from peer.pipeline.reservations import ForwardReservations
from peer.pipeline.rejoin import Isolation, Rejoin, unless_cut_off
from peer.pipeline.schedule_book import BoundaryRead, ScheduleBook
from peer.pipeline.seat import RunnerFactory, StageSeat
from peer.pipeline.sender import Sender
from peer.pipeline.settings import WorkerSettings
from peer.pipeline.spot_checks import SpotChecks
from peer.pipeline.state_sync import StateFetcher
from peer.routing.fallback import classify
from peer.routing.health import Health
from peer.transport.rpc import RpcClient
from swarmcore.outcomes import Outcome

from tokendata.cursor import microbatch_positions, schedule_cursor

__all__ = ["IterationOutcome", "PipelineWorker", "RunnerFactory", "StageSeat", "WorkerHooks", "WorkerSettings"]
logger = logging.getLogger(__name__)
ORIGIN_GONE_AFTER_FAILURES = 8   # consecutive failed heartbeats (about 8 x heartbeat_s or more)
LINK_WITNESS_S = 10.0            # a peer that answered us this recently shows our own link works

# (iteration, local index, data shard, shards, global sample positions) -> (tokens, targets)
BatchFn = Callable[[int, int, int, int, list[int]], tuple[torch.Tensor, torch.Tensor]]


class FellBehind(Exception):
    """Every origin finished iterations past ours: the swarm is at `iteration` (we were stopped,
    or restarted from an old checkpoint)."""

    def __init__(self, iteration: int):
        super().__init__(f"the swarm is at iteration {iteration}")
        self.iteration = iteration


@dataclass
class WorkerHooks:
    """What the peer app plugs into the worker, all at construction: the origin's training data
    and the callbacks."""

    batch: BatchFn | None = None                                    # origins only
    on_iteration: Callable[[IterationOutcome], Awaitable[None]] | None = None
    refresh_schedule: Callable[[], Awaitable[None]] | None = None   # re-read the schedule now
    publish_spot_checks: Callable[[SpotCheckRecord], Awaitable] | None = None
    read_progress: ProgressReader | None = None                     # the origins' DHT progress records
    fault: Callable[[int, str], bool] | None = None                 # chaos testing only: True drops the task
    on_late: Callable[[tuple[str, ...]], None] | None = None        # the peers marked late now (hop deadlines)


class PipelineWorker:
    def __init__(self, me: str, spec: m.RunSpec, rpc: RpcClient, book: ScheduleBook, seat: StageSeat,
                 settings: WorkerSettings, hooks: WorkerHooks | None = None, health: Health | None = None,
                 isolation: Isolation | None = None):
        self.me, self.spec, self.book, self.seat, self.settings = me, spec, book, seat, settings
        self.hooks = hooks or WorkerHooks()
        self.isolation = isolation or Isolation()      # written by peer/isolation.py's monitor
        self.inbox = Inbox()
        self.ledger = Ledger()
        self.tasks = Lifecycle("the work loop", logger)   # sends, spot checks, the monitor: run() owns them
        health = health or Health()
        self.spot = SpotChecks(me, rpc, health, seat.compute, self.tasks.spawn, settings.spot_check_rate,
                               settings.rpc_timeout_s, publish=self.hooks.publish_spot_checks)
        self.sender = Sender(me, spec.run, rpc, health, settings, self.ledger, self.inbox, self.spot, self.tasks,
                             self.book.missed_after)
        self.recovery = Recovery(me, spec.run, settings, seat, self.ledger, self.sender, self.tasks,
                                 self.hooks.on_late)
        self.exchange = GradientExchange(me, spec.run, settings, seat, self.ledger, self.sender,
                                         report=self.spot.add_report,
                                         delayed=spec.gradient_exchange == "delayed")
        self.rejoin = Rejoin(me, self.isolation, seat, self.ledger, self.inbox, book, health,
                             StateFetcher(me, spec.run, rpc, settings, seat), self.hooks.refresh_schedule)

    # ---- the loop ----

    async def run(self) -> None:
        """Iterations until max_steps, shutdown() or cancellation; every task the loop started
        (sends, spot checks, the successor monitor) ends with it."""
        try:
            await self.tasks.run(self._loop())
        finally:
            self.seat.close()

    def shutdown(self) -> None:
        self.tasks.shutdown()

    async def _loop(self) -> None:
        self.tasks.spawn(self.recovery.monitor(), "watching successors")
        ledger, spec = self.ledger, self.spec
        boundary_read = BoundaryRead(lambda: self.hooks.refresh_schedule, self.tasks.spawn)
        while True:
            await boundary_read.finish()
            schedule = await self._schedule_with_me()
            pending = self.exchange.pending
            if pending is not None and (pending.schedule.epoch != schedule.epoch or
                                        (spec.max_steps and ledger.iteration >= spec.max_steps)):
                await self.exchange.flush()   # delayed updates: none in flight into a new epoch or past the end
            if spec.max_steps and ledger.iteration >= spec.max_steps:
                await self.exchange.deliveries.flush(self.settings.send_deadline_s)
                return
            i = ledger.iteration
            try:
                outcome = await unless_cut_off(self.isolation, self.run_iteration(i, schedule, boundary_read))
            except FellBehind as behind:
                self.exchange.drop_pending()
                await self.rejoin.catch_up(i, behind.iteration, schedule)
                self._take_on_pending(schedule)
                continue
            if outcome is None:
                self.exchange.drop_pending()
                await self.rejoin.sit_out(i)
                self._take_on_pending(self.book.for_iteration(ledger.iteration))
                continue
            ledger.history.append(outcome)
            checkpoints = self.seat.checkpoints
            if checkpoints is not None and checkpoints.due(i, spec.max_steps):
                await self.exchange.flush()   # a checkpoint holds every update up to i
                await self.seat.checkpoint(i, self._data_cursor_after(schedule, i))
            if self.hooks.on_iteration is not None:
                await self.hooks.on_iteration(outcome)
            ledger.iteration += 1

    def _take_on_pending(self, schedule: Schedule | None) -> None:
        """After a state copy: take part in the update the replicas still had in flight."""
        pending = self.rejoin.fetcher.pending
        self.rejoin.fetcher.pending = -1
        if pending >= 0 and schedule is not None and self.seat.runner is not None:
            self.exchange.take_on(pending, schedule)
            self.seat.stepped_iteration = pending - 1

    def _data_cursor_after(self, schedule: Schedule, i: int) -> dict | None:
        """Stage 0's checkpoints carry where the sample cursor stands after iteration i."""
        if not self.seat.runner.is_origin:
            return None
        base, retry = schedule_cursor(schedule, self.spec.microbatch_samples).at(i + 1)
        return {"iteration": i + 1, "base": base, "retry": list(retry), "dataset_id": self.spec.dataset_id}

    async def _schedule_with_me(self) -> Schedule:
        """The schedule for the current iteration, waiting until one includes this peer."""
        ledger, seat = self.ledger, self.seat
        while True:
            schedule = self.book.for_iteration(ledger.iteration)
            latest = self.book.latest
            if schedule is not None and self.me in schedule.stage_of():
                break
            if latest is not None and self.me in latest.stage_of() and latest.start_iteration > ledger.iteration:
                ledger.iteration = latest.start_iteration  # we join the run where it is now
                continue
            await self.book.wait_changed(timeout=5.0)
        stage = schedule.stage_of()[self.me]
        self.book.began(ledger.iteration, as_origin=stage == 0)   # a new epoch for it is now late
        if stage != seat.stage:
            self.exchange.drop_pending()      # the old stage's update: its replicas apply it
            if seat.stage is not None:
                logger.warning("re-assigned from stage %d to %d: starting that stage afresh", seat.stage, stage)
            done = await seat.take(stage)
            if done is not None and done + 1 > ledger.iteration:
                ledger.iteration = done + 1
                seat.stepped_iteration = done
                return await self._schedule_with_me()
            # a checkpoint of the iteration just before this one is the stage's current state
            # (a resumed run re-partitions before anyone trains: every replica of the stage may
            # be new to it, and asking each other would only wait out the timeout)
            current = done is not None and done + 1 == ledger.iteration
            copied = False
            if ledger.iteration > 0 and not current and len(pv.replicas(schedule, stage)) > 1:
                copied = await self.rejoin.copy_state(schedule, stage)  # late join: the replicas' state
            if ledger.iteration > 0 and not current and not copied:
                seat.note_stale_start(stage, ledger.iteration, done)
            seat.stepped_iteration = ledger.iteration - 1
            self._take_on_pending(schedule)
        return schedule

    def iteration_over(self, st: IterationState, schedule: Schedule) -> bool:
        if self.seat.runner.is_origin:
            return not st.unresolved()
        # a slow origin is not a dead one: ending early would lose its microbatches, so only
        # a departure (advert gone) or a long silence counts
        h = self.sender.health     # (we never record an answer from ourselves: no witness)
        return all(o in st.done_origins or h.looks_gone(o, schedule.stage_of(), ORIGIN_GONE_AFTER_FAILURES,
                                                        LINK_WITNESS_S)
                   for o in pv.replicas(schedule, 0))

    async def run_iteration(self, i: int, schedule: Schedule, boundary_read: BoundaryRead | None = None
                            ) -> IterationOutcome:
        self.ledger.current = schedule
        runner = self.seat.runner
        self.spot.begin_iteration(i, runner)
        if self.hooks.fault is not None:
            self.hooks.fault(i, "START")
        st = self.ledger.state(i)
        outcome = IterationOutcome(i, schedule.epoch, self.seat.stage)
        if runner.is_origin:
            await self._enqueue_origin_forwards(i, schedule, st)
        await self._work_until_over(i, schedule, st, outcome)
        if boundary_read is not None:
            boundary_read.start()   # overlaps the exchange below
        if runner.is_origin:
            self.sender.announce_done(i, schedule, st)
        outcome.counts = st.counts()
        outcome.lost_microbatches = sorted(mb for mb, e in st.own.items() if e.outcome == Outcome.LOST)
        await self.exchange.average_and_step(i, schedule, outcome)   # sets seat.stepped_iteration
        self.end_iteration(i)
        outcome.finished_at = time.time()
        return outcome

    async def _work_until_over(self, i: int, schedule: Schedule, st: IterationState,
                               outcome: IterationOutcome) -> None:
        """Run ready tasks in planned order (forwards while the stash has room) until the
        iteration is over or its time is up."""
        planned = pv.priorities(schedule, self.me)
        deadline = time.monotonic() + self.settings.iteration_timeout_s

        reservations = ForwardReservations(planned)     # the one order rule (coordinator/planner/simulate.py)
        lagging = None if self.seat.runner.is_origin else LaggingOrigins(
            self.hooks.read_progress, self.tasks.spawn, self.inbox.poke, self.ledger.typical_iteration_s())
        origins = set(pv.replicas(schedule, 0))

        def allowed(task: pv.TaskKey) -> bool:
            return reservations.allows(task, self.seat.runner.stashed, self.settings.max_activations)

        while not self.iteration_over(st, schedule):
            left = deadline - time.monotonic()
            if left <= 0:
                outcome.timed_out = True
                self._give_up(i, st)
                break
            if lagging is not None:
                lagging.check(i, st, origins - st.done_origins, origins)
                if lagging.swarm_at is not None:
                    raise FellBehind(lagging.swarm_at)
            got = await self.inbox.take(i, allowed, lambda t: pv.priority_of(t, planned), min(left, 0.25))
            if got is not None:
                reservations.started(got[0])
                await self._run_task(i, schedule, st, got[0], got[1], outcome)

    def _give_up(self, i: int, st: IterationState) -> None:
        left = st.unresolved()
        if self.seat.runner.is_origin:
            for mb in left:
                st.own[mb].outcome = Outcome.LOST
            logger.error("iteration %d timed out: microbatch(es) %s LOST (not counted in the gradient)", i, left)
        else:
            missing = sorted(set(pv.replicas(self.ledger.current, 0)) - st.done_origins)
            logger.error("iteration %d timed out waiting for origin(s) %s", i, [p[:12] for p in missing])

    def end_iteration(self, i: int) -> None:
        self.inbox.drop_before(i + 1)
        self.ledger.end(i)

    async def _enqueue_origin_forwards(self, i: int, schedule: Schedule, st: IterationState) -> None:
        shard, shards = pv.data_shard(schedule, self.me)
        for local, route in enumerate(pv.origin_routes(schedule, self.me)):
            positions = microbatch_positions(schedule, self.spec.microbatch_samples, i, route.microbatch_id)
            tokens, targets = self.hooks.batch(i, local, shard, shards, positions)
            self.ledger.targets[(i, route.microbatch_id)] = targets
            st.own[route.microbatch_id] = OriginEntry(route, positions=tuple(positions))
            await self.inbox.put(i, pv.TaskKey(route.microbatch_id, pv.Kind.ORIGIN_FORWARD, 0),
                                 Work(tokens, route, 0, self.me))

    # ---- one task ----

    async def _run_task(self, i: int, schedule: Schedule, st: IterationState, task: pv.TaskKey,
                        work: Work, outcome: IterationOutcome) -> None:
        key, mb, r = (i, task.microbatch_id), task.microbatch_id, self.seat.runner
        compute, send = self.seat.compute, self._send
        if self.hooks.fault is not None and self.hooks.fault(i, task.kind.name):
            logger.warning("FAULT: dropping iteration %d microbatch %d %s", i, mb, task.kind.name)
            return
        if task.kind in (pv.Kind.BACKWARD, pv.Kind.ORIGIN_BACKWARD):
            why = st.expects_backward(mb, work.attempt, work.sender)
            if why is not None:
                logger.debug("dropping a backward: %s", why)
                return
        try:
            if task.kind == pv.Kind.ORIGIN_FORWARD:
                out = await self.seat.forward(r.forward_origin, key, work.tensor)
                st.own[mb].sent_at = time.monotonic()
                self._fly(st, work.route, 0, 0)
                send(i, schedule, work.route, task, out, 0)
            elif task.kind == pv.Kind.FORWARD:
                r.drop(key)  # an older attempt's activations, superseded by this one
                out = await self.seat.forward(r.forward, key, work.tensor)
                self._fly(st, work.route, task.hop_index, work.attempt)
                send(i, schedule, work.route, task, out, work.attempt)
            elif task.kind == pv.Kind.HEAD:
                await self._head(i, schedule, st, task, work)
            elif task.kind == pv.Kind.BACKWARD:
                flight = st.flights.pop(mb)
                self.recovery.returned(flight)
                grad = await compute(r.backward, key, work.tensor, mb not in st.counted)
                st.counted.add(mb)
                send(i, schedule, flight.route, task, grad, flight.upstream_attempt)
            else:
                await self._origin_backward(i, st, mb, work, outcome)
        except ComputeError as exc:
            logger.error("microbatch %d: %s failed: %s", mb, task.kind.name, exc)
            r.drop(key)
            st.flights.pop(mb, None)
            await self.recovery.compute_failed(i, schedule, st, mb, work, str(exc))

    def _send(self, i: int, schedule: Schedule, route: Route, task: pv.TaskKey, tensor: torch.Tensor,
              attempt: int) -> None:
        """In the background; a forward its next hop does not take goes to recovery."""
        self.tasks.spawn(self.recovery.deliver(i, schedule, route, task, tensor, attempt))

    def _fly(self, st: IterationState, route: Route, hop: int, attempt: int) -> None:
        st.flights[route.microbatch_id] = Flight(route, hop, attempt, pv.next_hop(route, hop), upstream_attempt=attempt)

    async def _head(self, i: int, schedule: Schedule, st: IterationState, task: pv.TaskKey, work: Work) -> None:
        mb = task.microbatch_id
        entry = st.own[mb]
        loss, grad = await self.seat.compute(self.seat.runner.head_loss, (i, mb), work.tensor,
                                             self.ledger.targets[(i, mb)], entry.head_attempt >= 0)
        entry.head_route, entry.head_attempt = work.route, work.attempt
        entry.loss_sum = loss * self.spec.microbatch_samples
        self._send(i, schedule, work.route, task, grad, work.attempt)

    async def _origin_backward(self, i: int, st: IterationState, mb: int, work: Work,
                               outcome: IterationOutcome) -> None:
        self.recovery.returned(st.flights.pop(mb))
        entry = st.own[mb]
        returned_at = time.monotonic()
        await self.seat.compute(self.seat.runner.backward_origin, (i, mb), work.tensor)
        entry.outcome = classify(entry.planned, entry.head_route, entry.reissued)
        if entry.outcome == Outcome.COMPLETED and entry.sent_at > 0:
            outcome.round_trips[mb] = returned_at - entry.sent_at   # the coordinator's witness of the route
        outcome.loss_sum += entry.loss_sum
        outcome.samples += self.spec.microbatch_samples
        outcome.positions.extend(entry.positions)
        outcome.stages_visited += len(entry.head_route.hops)
        if entry.outcome != Outcome.COMPLETED:
            logger.info("iteration %d microbatch %d %s via %s", i, mb, entry.outcome,
                        [(h.stage, h.peer[:8]) for h in entry.head_route.hops])
