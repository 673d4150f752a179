"""Incoming requests: validate everything a remote peer sends before it touches our state.

Each check answers with a specific ErrorReply (the RpcServer turns ProtocolErrors into
replies), so a bad or stale request costs the sender a clear error and costs us nothing.
"""
import asyncio
import logging
from typing import Awaitable, Callable

from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.schedule import Phase

import torch

from peer.compute import tensor_codec
from peer.compute.model import get_config
from peer.compute.errors import BadTensor
from peer.pipeline import plan_view as pv
from peer.pipeline.inbox import InboxFull
from peer.pipeline.worker import PipelineWorker

logger = logging.getLogger(__name__)
ITERATIONS_AHEAD = 2          # how far ahead of our own iteration we buffer work
FLOAT_WIRE_DTYPES = ("float32", "float16", "bfloat16")


class Rejected(ProtocolError):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class WorkHandlers:
    def __init__(self, worker: PipelineWorker, refresh_schedule: Callable[[], Awaitable[None]]):
        self.worker = worker
        self.refresh_schedule = refresh_schedule
        self.bad_senders: dict[str, int] = {}
        self.hidden_dim = get_config(worker.spec.model).dim  # known before our stage is loaded

    def register(self, server) -> None:
        server.register(m.ForwardRequest, self.forward)
        server.register(m.BackwardRequest, self.backward)
        server.register(m.GradientShare, self.gradient_share)
        server.register(m.Ping, self.ping)

    async def forward(self, remote: str, request: m.ForwardRequest) -> m.ForwardReply:
        await self._accept(remote, request.header, request.tensor, Phase.FORWARD)
        return m.ForwardReply(request.header)

    async def backward(self, remote: str, request: m.BackwardRequest) -> m.BackwardReply:
        await self._accept(remote, request.header, request.tensor, Phase.BACKWARD)
        return m.BackwardReply(request.header)

    async def ping(self, remote: str, request: m.Ping) -> m.Pong:
        return m.Pong(request.nonce, request.payload)

    async def _schedule_for(self, header_run: str, epoch: int, iteration: int):
        w = self.worker
        if header_run != w.spec.run:
            raise Rejected(ErrorCode.UNKNOWN_RUN, f"this peer serves run {w.spec.run!r}, not {header_run!r}")
        if iteration < w.iteration:
            raise Rejected(ErrorCode.STALE_SCHEDULE, f"iteration {iteration} is over (we are at {w.iteration})")
        if iteration > w.iteration + ITERATIONS_AHEAD:
            raise Rejected(ErrorCode.OVERLOADED, f"iteration {iteration} is too far ahead of ours ({w.iteration})")
        latest = w.book.latest
        if latest is None or epoch > latest.epoch:
            await asyncio.wait_for(self.refresh_schedule(), timeout=5.0)
        schedule = w.book.for_iteration(iteration)
        if schedule is None or schedule.epoch != epoch:
            have = None if schedule is None else schedule.epoch
            raise Rejected(ErrorCode.STALE_SCHEDULE,
                           f"epoch {epoch} does not apply to iteration {iteration} here (we use {have})")
        return schedule

    async def _accept(self, remote: str, header: m.WorkHeader, payload, phase: Phase) -> None:
        w = self.worker
        schedule = await self._schedule_for(header.run, header.epoch, header.iteration)
        try:
            route = schedule.route(header.microbatch_id)
        except KeyError:
            raise Rejected(ErrorCode.UNKNOWN_MICROBATCH, f"no microbatch {header.microbatch_id} in epoch {header.epoch}") from None
        task = pv.task_for_request(route, w.me, phase, header.hop_index)
        if task is None:
            raise Rejected(ErrorCode.WRONG_STAGE, f"hop {header.hop_index} of microbatch {header.microbatch_id} is not ours")
        if remote != pv.expected_sender(route, task):
            raise Rejected(ErrorCode.NOT_MEMBER, f"{remote[:12]} is not the previous hop of microbatch "
                                                 f"{header.microbatch_id}; refusing its tensor")
        shape = (w.spec.microbatch_samples, w.spec.seq_len, self.hidden_dim)
        try:
            tensor = tensor_codec.decode(payload, expect_shape=shape, expect_dtype=FLOAT_WIRE_DTYPES,
                                         cast_to=torch.float32, what=f"{phase.name.lower()} tensor")
            if not bool(tensor.isfinite().all()):
                raise BadTensor(f"{phase.name.lower()} tensor", "contains NaN or Inf", non_finite=True)
        except BadTensor as exc:
            self.bad_senders[remote] = self.bad_senders.get(remote, 0) + 1
            logger.warning("rejected a %s from %s: %s", phase.name.lower(), remote[:12], exc)
            raise Rejected(exc.code, str(exc)) from None
        try:
            await w.inbox.put(header.iteration, task, tensor)
        except InboxFull as exc:
            raise Rejected(ErrorCode.OVERLOADED, str(exc)) from None

    async def gradient_share(self, remote: str, share: m.GradientShare) -> m.GradientShareAck:
        w = self.worker
        schedule = await self._schedule_for(share.run, share.epoch, share.iteration)
        ours = schedule.stage_of().get(w.me)
        if share.stage != ours or remote not in pv.replicas(schedule, share.stage):
            raise Rejected(ErrorCode.WRONG_STAGE, f"{remote[:12]} is not a replica of our stage {ours}")
        if w.runner is None or w.stage != ours:
            raise Rejected(ErrorCode.OVERLOADED, "our stage is still loading; retry")
        n = w.runner.num_parameters()
        try:
            vector = tensor_codec.decode(share.tensor, expect_shape=(n,), expect_dtype="float32",
                                         what="gradient share")
        except BadTensor as exc:
            raise Rejected(ErrorCode.BAD_TENSOR, str(exc)) from None
        if not bool(vector.isfinite().all()) or share.samples < 0:
            raise Rejected(ErrorCode.NON_FINITE, "gradient share is not finite")
        await w.shares.add(remote, share, vector)
        return m.GradientShareAck(share.iteration)
