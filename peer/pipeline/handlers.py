"""Incoming requests: validate everything a remote peer sends before it touches our state.

Each check answers with a specific ErrorReply (the RpcServer turns ProtocolErrors into
replies), so a bad or stale request costs the sender a clear error and costs us nothing.
"""
import asyncio
import logging
import time
from typing import Awaitable, Callable

from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.schedule import Phase
from protocol.spot_checks import SpotCheckGradient, SpotCheckGradientReference, SpotCheckReference, SpotCheckRequest

import torch

from peer.compute.model import spec_config
from peer.compute.errors import BadTensor
from peer.pipeline import plan_view as pv
from peer.pipeline import backward_checks, spot_checks, wire
from peer.pipeline.inbox import InboxFull
from peer.pipeline.share_codec import decode_share
from peer.pipeline.flights import Work
from peer.pipeline.state_sync import Ahead, Joining, NotReady, StateDonor
from peer.pipeline.worker import PipelineWorker
from peer.routing import fallback


logger = logging.getLogger(__name__)
ITERATIONS_AHEAD = 2          # how far ahead of our own iteration we buffer work
SHARE_SAMPLES_SLACK = 4     # x the iteration's planned samples: re-sent microbatches count again


class Rejected(ProtocolError):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class WorkHandlers:
    def __init__(self, worker: PipelineWorker, refresh_schedule: Callable[[], Awaitable[None]]):
        self.worker = worker
        self.refresh_schedule = refresh_schedule
        self.bad_senders: dict[str, int] = {}
        self.donor = StateDonor(worker.seat)    # serves our stage's state and weights
        self.hidden_dim = spec_config(worker.spec).dim  # known before our stage is loaded

    def register(self, server) -> None:
        server.register(m.ForwardRequest, self.forward)
        server.register(m.BackwardRequest, self.backward)
        server.register(m.GradientShare, self.gradient_share)
        server.register(m.Ping, self.ping)
        server.register(m.IterationDone, self.iteration_done)
        server.register(m.MicrobatchFailed, self.microbatch_failed)
        server.register(m.StateRequest, self.state_request)
        server.register(m.WeightsRequest, self.weights_request)
        server.register(SpotCheckRequest, self.spot_check_request)
        server.register(SpotCheckReference, self.spot_check_reference)
        server.register(SpotCheckGradient, self.spot_check_gradient)
        server.register(SpotCheckGradientReference, self.spot_check_gradient_reference)

    async def forward(self, remote: str, request: m.ForwardRequest) -> m.ForwardReply:
        await self._accept(remote, request.header, wire.received(request), Phase.FORWARD)
        return m.ForwardReply(request.header)

    async def backward(self, remote: str, request: m.BackwardRequest) -> m.BackwardReply:
        await self._accept(remote, request.header, wire.received(request), Phase.BACKWARD)
        return m.BackwardReply(request.header)

    async def ping(self, remote: str, request: m.Ping) -> m.Pong:
        return m.Pong(request.nonce, request.payload)

    async def _schedule_for(self, header_run: str, epoch: int, iteration: int, over_ok: bool = False):
        """`over_ok`: an iteration before ours is still taken (a delayed update's shares)."""
        w = self.worker
        if w.isolation.away:   # our work was rerouted while we were cut off: take none until we rejoin
            raise Rejected(ErrorCode.SHUTTING_DOWN, "this peer is sitting out a partition until it rejoins")
        if header_run != w.spec.run:
            raise Rejected(ErrorCode.UNKNOWN_RUN, f"this peer serves run {w.spec.run!r}, not {header_run!r}")
        ours = w.ledger.iteration
        if iteration < ours and not over_ok:
            raise Rejected(ErrorCode.ITERATION_OVER, f"iteration {iteration} is over (we are at {ours})")
        if iteration > ours + ITERATIONS_AHEAD:
            raise Rejected(ErrorCode.OVERLOADED, f"iteration {iteration} is too far ahead of ours ({ours})")
        latest = w.book.latest
        if latest is None or epoch > latest.epoch:
            await asyncio.wait_for(self.refresh_schedule(), timeout=5.0)
        w.book.follow(epoch, iteration)
        schedule = w.book.for_iteration(iteration)
        if schedule is None or schedule.epoch != epoch:
            have = None if schedule is None else schedule.epoch
            raise Rejected(ErrorCode.STALE_SCHEDULE,
                           f"epoch {epoch} does not apply to iteration {iteration} here (we use {have})")
        return schedule

    async def _accept(self, remote: str, header: m.WorkHeader, payload, phase: Phase) -> None:
        w = self.worker
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        mb = header.microbatch_id
        route = self._route_of(schedule, header)
        task = pv.task_for_request(route, w.me, phase, header.hop_index)
        if task is None:
            raise Rejected(ErrorCode.WRONG_STAGE, f"hop {header.hop_index} of microbatch {mb} is not ours")
        st = w.ledger.state(header.iteration)
        if phase == Phase.FORWARD:
            if remote != pv.expected_sender(route, task):
                raise Rejected(ErrorCode.NOT_MEMBER, f"{remote[:12]} is not the previous hop of microbatch "
                                                     f"{mb}; refusing its tensor")
            self._check_forward_attempt(st, task, header)
        else:
            why = st.expects_backward(mb, header.attempt, remote)
            if why is not None:
                raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, why)
        self._origin_moved_on(route.origin, header.iteration)
        tensor = self._decode_activation(remote, payload, phase)
        # a gradient of outlying size, or from a peer whose backward failed our check, is left out
        taken = tensor if phase == Phase.FORWARD else \
            w.spot.taken_backward(remote, tensor, route, header.hop_index, header.iteration)
        try:
            await w.inbox.put(header.iteration, task, Work(taken, route, header.attempt, remote))
        except InboxFull as exc:
            raise Rejected(ErrorCode.OVERLOADED, str(exc)) from None
        if phase == Phase.FORWARD:
            st.record_attempt(mb, task.kind, header.attempt)
            w.spot.saw_forward(schedule, route, header, remote, tensor, payload.dtype, wire.block_of(payload),
                                wire.has_offsets(payload), wire.has_channels(payload))
        else:
            flight = st.flights.get(mb)   # its hop deadline is met (hop_deadlines.py)
            if flight is not None and flight.attempt == header.attempt:
                flight.returned_at = flight.returned_at or time.monotonic()
            w.spot.backward.saw_backward(header, remote, tensor, payload.dtype, wire.block_of(payload),
                                         wire.has_offsets(payload), wire.has_channels(payload))

    def _origin_moved_on(self, origin: str, iteration: int) -> None:
        """Work of `iteration` from `origin`'s microbatches (checked as the route's, from its
        rightful sender) means the origin is done with every earlier iteration: a backup for
        an IterationDone that did not reach us (we were stopped, or cut off, when it came)."""
        w = self.worker
        for i in range(w.ledger.iteration, iteration):
            w.ledger.state(i).done_origins.add(origin)

    def _route_of(self, schedule, header: m.WorkHeader):
        """The route this microbatch takes: the planned one, or a recovered one we accept."""
        try:
            planned = schedule.route(header.microbatch_id)
        except KeyError:
            raise Rejected(ErrorCode.UNKNOWN_MICROBATCH,
                           f"no microbatch {header.microbatch_id} in epoch {header.epoch}") from None
        if header.route is None:
            return planned
        budget = fallback.budget_for(planned, schedule.num_stages, schedule.skip_ratio,
                                     self.worker.settings.extra_skips)
        why = fallback.check_route(header.route, planned, schedule.stage_of(), budget)
        if why is not None:
            raise Rejected(ErrorCode.WRONG_STAGE, f"recovered route of microbatch {header.microbatch_id} "
                                                  f"refused: {why}")
        return header.route

    def _check_forward_attempt(self, st, task: pv.TaskKey, header: m.WorkHeader) -> None:
        mb = header.microbatch_id
        if task.kind == pv.Kind.HEAD:
            entry, flight = st.own.get(mb), st.flights.get(mb)
            if entry is None or entry.outcome is not None or flight is None:
                raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, f"microbatch {mb} is not in flight here")
            if header.attempt < flight.attempt:
                raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, f"attempt {header.attempt} of microbatch "
                                                             f"{mb} is superseded")
        why = st.check_attempt(mb, task.kind, header.attempt)
        if why == "duplicate":
            raise Rejected(ErrorCode.DUPLICATE, f"already have attempt {header.attempt} of microbatch {mb}")
        if why is not None:
            raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, f"attempt {header.attempt} of microbatch {mb} is {why}")

    def _decode_activation(self, remote: str, payload, phase: Phase) -> torch.Tensor:
        """float32 activation or gradient of a float or quantised payload (wire.py); a malformed
        one (shape, dtype, length, scale count, a non-finite or negative scale, NaN) is refused."""
        w = self.worker
        shape = (w.spec.microbatch_samples, w.spec.seq_len, self.hidden_dim)
        try:
            tensor = wire.decode(payload, shape, f"{phase.name.lower()} tensor",
                                 w.sender.wire.versions.get(remote), phase == Phase.FORWARD)
            if not bool(tensor.isfinite().all()):
                raise BadTensor(f"{phase.name.lower()} tensor", "contains NaN or Inf", non_finite=True)
        except BadTensor as exc:
            self.bad_senders[remote] = self.bad_senders.get(remote, 0) + 1
            logger.warning("rejected a %s from %s: %s", phase.name.lower(), remote[:12], exc)
            raise Rejected(exc.code, str(exc)) from None
        return tensor

    async def spot_check_request(self, remote: str, request: SpotCheckRequest) -> m.ForwardReply:
        """Recompute another replica's forward for a spot check (in the background; the result
        goes to the next hop as a SpotCheckReference). Validated like a forward."""
        w, header = self.worker, request.header
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        route = self._route_of(schedule, header)
        why = spot_checks.request_problem(route, header.hop_index, remote, w.me, schedule.stage_of().get(w.me))
        if why is not None:
            raise Rejected(ErrorCode.WRONG_STAGE, f"spot check refused: {why}")
        code = w.spot.admit(header)
        if code is not None:
            raise Rejected(code, f"spot check of microbatch {header.microbatch_id} not taken ({code.name.lower()})")
        tensor = self._decode_activation(remote, request.tensor, Phase.FORWARD)
        w.spot.serve(route, header, tensor)
        return m.ForwardReply(header)

    async def spot_check_reference(self, remote: str, ref: SpotCheckReference) -> m.Ack:
        """Another replica's output for the forward the hop before us sends (or sent) us."""
        w, header = self.worker, ref.header
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        route = self._route_of(schedule, header)
        why = spot_checks.reference_problem(route, header.hop_index, remote, ref.suspect, w.me,
                                            lambda stage: pv.replicas(schedule, stage))
        if why is not None:
            raise Rejected(ErrorCode.NOT_MEMBER, f"spot-check reference refused: {why}")
        tensor = self._decode_activation(remote, ref.tensor, Phase.FORWARD)
        w.spot.add_reference(route, header, ref.suspect, remote, tensor, ref.tensor.dtype)
        return m.Ack(header.iteration)

    async def spot_check_gradient(self, remote: str, msg: SpotCheckGradient) -> m.Ack:
        """The next hop's gradient for a hop whose forward we recomputed for a spot check: its
        backward is recomputed too (backward_checks.py), the result goes to the hop before."""
        w, header = self.worker, msg.header
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        route = self._route_of(schedule, header)
        why = backward_checks.gradient_problem(route, header.hop_index, remote, msg.suspect, w.me,
                                               schedule.stage_of().get(w.me))
        if why is not None:
            raise Rejected(ErrorCode.WRONG_STAGE, f"backward check refused: {why}")
        if not w.spot.backward.has_input(header):
            raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, f"no spot-check input kept for microbatch "
                                                         f"{header.microbatch_id} hop {header.hop_index}")
        if w.spot.serving >= spot_checks.MAX_SERVING:
            raise Rejected(ErrorCode.OVERLOADED, "busy with other spot checks")
        grad = self._decode_activation(remote, msg.tensor, Phase.BACKWARD)
        w.spot.backward.serve(route, header, grad)
        return m.Ack(header.iteration)

    async def spot_check_gradient_reference(self, remote: str, ref: SpotCheckGradientReference) -> m.Ack:
        """Another replica's input gradient for the backward the hop after us sends (or sent) us."""
        w, header = self.worker, ref.header
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        route = self._route_of(schedule, header)
        why = backward_checks.gradient_reference_problem(route, header.hop_index, remote, ref.suspect, w.me,
                                                         lambda stage: pv.replicas(schedule, stage))
        if why is not None:
            raise Rejected(ErrorCode.NOT_MEMBER, f"backward spot-check reference refused: {why}")
        tensor = self._decode_activation(remote, ref.tensor, Phase.BACKWARD)
        w.spot.backward.add_reference(header, ref.suspect, remote, tensor, ref.tensor.dtype)
        return m.Ack(header.iteration)

    async def iteration_done(self, remote: str, done: m.IterationDone) -> m.Ack:
        w = self.worker
        if done.iteration < w.ledger.iteration:
            return m.Ack(done.iteration)  # we moved on already
        schedule = await self._schedule_for(done.run, done.epoch, done.iteration)
        if remote not in pv.replicas(schedule, 0):
            raise Rejected(ErrorCode.NOT_MEMBER, f"{remote[:12]} is not a stage-0 peer of epoch {done.epoch}")
        self._origin_moved_on(remote, done.iteration + 1)   # and so with every earlier one
        await w.inbox.poke()
        return m.Ack(done.iteration)

    async def state_request(self, remote: str, req: m.StateRequest) -> m.StateReply:
        w = self.worker
        if req.run != w.spec.run:
            raise Rejected(ErrorCode.UNKNOWN_RUN, f"this peer serves run {w.spec.run!r}, not {req.run!r}")
        schedule = w.book.for_iteration(req.iteration)
        if schedule is None or schedule.stage_of().get(remote) != req.stage:
            await asyncio.wait_for(self.refresh_schedule(), timeout=5.0)
            schedule = w.book.for_iteration(req.iteration)
        if schedule is None or schedule.stage_of().get(remote) != req.stage:
            raise Rejected(ErrorCode.NOT_MEMBER, f"{remote[:12]} is not a replica of stage {req.stage} "
                                                 f"at iteration {req.iteration}")
        try:
            return await self.donor.reply(req)
        except NotReady as exc:
            raise Rejected(ErrorCode.OVERLOADED, str(exc)) from None
        except Joining as exc:
            raise Rejected(ErrorCode.NOT_FOUND, str(exc)) from None
        except Ahead as exc:
            raise Rejected(ErrorCode.ITERATION_OVER, str(exc)) from None
        except ValueError as exc:
            raise Rejected(ErrorCode.WRONG_STAGE, str(exc)) from None

    async def weights_request(self, remote: str, req: m.WeightsRequest) -> m.WeightsReply:
        """Export of a live run: our stage's current weights to whoever may talk to us (anyone
        in an open run; with a join key the RPC gate has admitted members only)."""
        w = self.worker
        if req.run != w.spec.run:
            raise Rejected(ErrorCode.UNKNOWN_RUN, f"this peer serves run {w.spec.run!r}, not {req.run!r}")
        try:
            return await self.donor.weights(req)
        except ValueError as exc:
            raise Rejected(ErrorCode.WRONG_STAGE, str(exc)) from None

    async def microbatch_failed(self, remote: str, report: m.MicrobatchFailed) -> m.Ack:
        w, header = self.worker, report.header
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        route = self._route_of(schedule, header)
        if route.origin != w.me:
            raise Rejected(ErrorCode.WRONG_STAGE, f"we are not the origin of microbatch {header.microbatch_id}")
        if remote not in {h.peer for h in route.hops}:
            raise Rejected(ErrorCode.NOT_MEMBER, f"{remote[:12]} is not on microbatch "
                                                 f"{header.microbatch_id}'s route")
        w.tasks.spawn(w.recovery.on_failed_report(remote, report))
        return m.Ack(header.iteration)

    async def gradient_share(self, remote: str, share: m.GradientShare) -> m.GradientShareAck:
        w = self.worker
        # delayed updates: the exchange of the iteration before ours is still on
        schedule = await self._schedule_for(share.run, share.epoch, share.iteration,
                                            over_ok=share.iteration == w.seat.pending_iteration)
        ours = schedule.stage_of().get(w.me)
        if share.stage != ours or remote not in pv.replicas(schedule, share.stage):
            raise Rejected(ErrorCode.WRONG_STAGE, f"{remote[:12]} is not a replica of our stage {ours}")
        if w.seat.runner is None or w.seat.stage != ours:
            raise Rejected(ErrorCode.OVERLOADED, "our stage is still loading; retry")
        n = w.seat.runner.num_parameters()
        try:
            vector = decode_share(share.tensor, share.scales, n)
        except BadTensor as exc:
            raise Rejected(ErrorCode.BAD_TENSOR, str(exc)) from None
        if not bool(vector.isfinite().all()) or share.samples < 0:
            raise Rejected(ErrorCode.NON_FINITE, "gradient share is not finite")
        # at most every planned microbatch's samples, with room for re-sent ones: a replica that
        # claimed 2**64 - 1 samples once crashed the step's division (OverflowError)
        most = SHARE_SAMPLES_SLACK * max(1, len(schedule.routes)) * w.spec.microbatch_samples
        if share.samples > most:
            raise Rejected(ErrorCode.MALFORMED, f"a share of {share.samples} samples: iteration "
                                                f"{share.iteration} has at most {most}")
        await w.exchange.shares.add(remote, share, vector)
        return m.GradientShareAck(share.iteration)
