"""Late join: a new replica of a stage copies that stage's parameters and optimizer state
from a live replica before it trains, so replicas stay identical and the first iteration it
joins counts its contribution like any other replica's.

The joiner trains from iteration s (its schedule's start); it asks for the state the replicas
train iteration s with: after iteration s - 1's update (sync), or, with delayed updates
(RunSpec.gradient_exchange), after s - 2's with s - 1's pending (StateReply.pending: the joiner
takes part in it with a zero share, GradientExchange.take_on), or after s - 1's where a flush
left none pending (an epoch's first iteration). A live replica cannot step past s before the
joiner's gradient share arrives, so its state holds still until the joiner is ready: it
answers from one snapshot, in chunks (replies stay far below the message limit).
"""
import asyncio
import logging
import time

import torch

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.schedule import Schedule

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from peer.compute.state_transfer import flat_state, load_flat_state, state_size
from peer.pipeline import plan_view as pv
from peer.pipeline.seat import StageSeat
from peer.pipeline.settings import WorkerSettings
from peer.progress import Progress
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

logger = logging.getLogger(__name__)
CHUNK_ELEMENTS = 1 << 19          # 2 MiB of float32 per reply
# a donor that says we are no replica of the stage at that iteration may not have read our
# epoch yet (a DHT poll: seconds); one that keeps saying so runs another epoch there (its
# origins missed ours: tests/swarm/test_netns.py asked one for 120 s): not waited for beyond this
NOT_MEMBER_PATIENCE_S = 20.0


class NotReady(Exception):
    """The donor has not finished the iteration before the one asked for (retry later)."""


class Joining(Exception):
    """The donor is itself copying the stage's state (it joined, rejoined or fell behind too):
    it has no live state to give, and waiting for it would wait for each other (two replicas
    that both came back from checkpoints once waited out the 120 s timeout so)."""


class Ahead(Exception):
    """The donor trains a later iteration than the one asked for: the asker fell behind again
    (two lagging replicas once picked catch-up targets two iterations apart, and the one behind
    asked the other for 30 s for a state it had passed)."""


class NoLiveState(Exception):
    """A replica that cannot give the state asked for, now or later (Joining or Ahead on its
    side): not waited for."""


class StateDonor:
    """Serving side: one snapshot per requested iteration."""

    def __init__(self, seat: StageSeat):
        self.seat = seat
        self._snapshot: tuple[tuple, torch.Tensor, int, int, int | None] | None = None
        self._weights: tuple[int, torch.Tensor, int] | None = None   # (id, parameters, iteration)
        self._weights_id = 0

    async def reply(self, req: m.StateRequest) -> m.StateReply:
        seat = self.seat
        if seat.runner is None or seat.stage != req.stage:
            raise ValueError(f"we do not host stage {req.stage}")
        if seat.fetching_state:
            raise Joining(f"we are copying stage {req.stage}'s state ourselves: no live state here")
        trains = seat.trains_iteration()
        if seat.stepping:
            raise NotReady("we are applying an update")
        if trains < req.iteration:
            raise NotReady(f"our parameters are for iteration {trains}, not yet {req.iteration}")
        if trains > req.iteration:
            raise Ahead(f"we are past iteration {req.iteration - 1} already (at {trains})")
        key = (req.iteration, seat.stepped_iteration, seat.pending_iteration)
        if self._snapshot is None or self._snapshot[0] != key:
            vector, steps, adam = await seat.compute(flat_state, seat.runner)
            self._snapshot = (key, vector, steps, adam, seat.pending_iteration)
        _, vector, steps, adam, pending = self._snapshot
        if req.offset >= vector.numel():
            raise ValueError(f"offset {req.offset} is past the state's {vector.numel()} elements")
        part = vector[req.offset:req.offset + min(req.max_elements, CHUNK_ELEMENTS)]
        return m.StateReply(req.stage, req.iteration, vector.numel(), req.offset, steps, adam,
                            tensor_codec.encode(part), -1 if pending is None else pending)


    async def weights(self, req: m.WeightsRequest) -> m.WeightsReply:
        """Export: our stage's parameters from one snapshot (taken on the compute thread, so
        between steps); a newer first request replaces it, and readers of the old one restart."""
        seat = self.seat
        if seat.runner is None or seat.stage != req.stage:
            raise ValueError(f"we do not host stage {req.stage}")
        if req.snapshot == 0:
            if req.offset:
                raise ValueError("a new snapshot is read from offset 0")
            vector, iteration = await seat.compute(lambda r: (r.parameter_vector(), seat.stepped_iteration),
                                                   seat.runner)
            self._weights_id += 1
            self._weights = (self._weights_id, vector, iteration)
        elif self._weights is None or self._weights[0] != req.snapshot:
            raise ValueError(f"snapshot {req.snapshot} is gone (another reader took a newer one); start again")
        sid, vector, iteration = self._weights
        if req.offset >= vector.numel():
            raise ValueError(f"offset {req.offset} is past the stage's {vector.numel()} parameters")
        part = vector[req.offset:req.offset + min(req.max_elements, CHUNK_ELEMENTS)]
        module = seat.runner.module
        return m.WeightsReply(req.stage, sid, iteration, module.layer_start, module.layer_end, vector.numel(),
                              req.offset, tensor_codec.encode(part))


State = tuple[torch.Tensor, int, int, int]     # (flat state, step count, AdamW step, pending iteration or -1)


def agreed_state(states: dict[str, State]) -> tuple[str, State] | None:
    """A state that two replicas gave bit for bit (replicas of a stage are identical), with
    one donor that gave it; None while no two agree."""
    donors = sorted(states)
    for i, a in enumerate(donors):
        for b in donors[i + 1:]:
            (va, *ca), (vb, *cb) = states[a], states[b]
            if ca == cb and torch.equal(va, vb):
                return a, states[a]
    return None


class StateFetcher:
    """Joiner side: copies the stage's state from one of its live replicas into our seat."""

    def __init__(self, me: str, run: str, rpc: RpcClient, settings: WorkerSettings, seat: StageSeat):
        self.me, self.run, self.rpc, self.settings, self.seat = me, run, rpc, settings, seat
        self.pending = -1       # the last state taken: the update still pending with it (-1: none)
        self._refused_since: dict[str, float] = {}   # donor -> first NOT_MEMBER of this fetch

    async def fetch(self, schedule: Schedule, stage: int, iteration: int, timeout_s: float | None = None) -> bool:
        """The state as it is after iteration - 1; False if no replica could give it before the
        iteration timeout (logged). Taken only when two replicas gave the same state (one that
        noised its copy is outvoted), or, with one replica left or after half the timeout with
        one answer, from that one (logged as unverified); a state that fails the checks of
        load_flat_state (non-finite values, negative second moments, ...) is refused."""
        self.pending = -1
        donors = [p for p in pv.replicas(schedule, stage) if p != self.me]
        if not donors:
            return False
        self.seat.fetching_state = True
        try:
            return await self._fetch(donors, schedule, stage, iteration, timeout_s)
        finally:
            self.seat.fetching_state = False

    async def _fetch(self, donors: list[str], schedule: Schedule, stage: int, iteration: int,
                     timeout_s: float | None) -> bool:
        started = time.monotonic()
        timeout_s = timeout_s or self.settings.iteration_timeout_s
        deadline = started + timeout_s
        got: dict[str, State] = {}
        self._refused_since = {}
        while time.monotonic() < deadline:
            for donor in [d for d in donors if d not in got]:
                try:
                    state = await self._try_pull(donor, stage, iteration, schedule.start_iteration)
                except NoLiveState as why:
                    logger.info("replica %s has no state of stage %d for iteration %d to give (%s): not "
                                "waiting for it", donor[:12], stage, iteration, why)
                    donors.remove(donor)
                    continue
                if state is not None:
                    got[donor] = state
            chosen = agreed_state(got)
            waited_half = time.monotonic() - started > timeout_s / 2
            alone = len(got) == 1 and (len(donors) == 1 or waited_half)
            if chosen is None and alone:
                chosen = next(iter(got.items()))
                logger.warning("stage %d's state from %s alone: no second replica could confirm it", stage,
                               chosen[0][:12])
            if chosen is not None:
                donor, (vector, steps, adam, *rest) = chosen
                try:
                    await self.seat.compute(load_flat_state, self.seat.runner, vector, steps, adam)
                except ValueError as exc:
                    logger.warning("refused the state of stage %d from %s: %s", stage, donor[:12], exc)
                    donors = [d for d in donors if d != donor]
                    got = {d: s for d, s in got.items() if d != donor}
                    continue
                self.pending = rest[0] if rest else -1
                logger.info("joined stage %d with the state of replica %s for iteration %d (%d floats, step %d%s)",
                            stage, donor[:12], iteration, vector.numel(), steps,
                            f", iteration {self.pending}'s update pending" if self.pending >= 0 else "")
                return True
            if not donors:
                break
            await asyncio.sleep(0.5)
        logger.error("no replica of stage %d gave us its state; going on with the state we hold", stage)
        return False

    async def _try_pull(self, donor: str, stage: int, iteration: int, epoch_start: int) -> "State | None":
        try:
            return await self._pull(donor, stage, iteration, epoch_start)
        except (NotReady, TransportError) as exc:
            logger.debug("state from %s not available yet: %s", donor[:12], exc)
        except (RemoteError, BadTensor, ValueError) as exc:
            if isinstance(exc, RemoteError) and exc.code in (ErrorCode.NOT_FOUND, ErrorCode.ITERATION_OVER):
                raise NoLiveState(exc.reply.message) from None
            if isinstance(exc, RemoteError) and exc.code == ErrorCode.NOT_MEMBER:
                since = self._refused_since.setdefault(donor, time.monotonic())
                if time.monotonic() - since > NOT_MEMBER_PATIENCE_S:
                    raise NoLiveState(f"{exc.reply.message} for {NOT_MEMBER_PATIENCE_S:.0f}s: it runs another "
                                      f"epoch at that iteration") from None
            if not (isinstance(exc, RemoteError) and exc.code == ErrorCode.OVERLOADED):
                logger.warning("state transfer from %s failed: %s", donor[:12], exc)
        return None

    async def _pull(self, donor: str, stage: int, iteration: int, epoch_start: int = 0) -> State:
        """The donor's state in chunks; NotReady while it still has an update of the previous
        epoch in flight (it flushes that before the epoch's first iteration)."""
        total = state_size(self.seat.runner)
        out = torch.empty(total, dtype=torch.float32)
        offset, counters = 0, None
        progress = Progress(f"copying stage {stage}'s state from {donor[:12]}", total, "MB", logger, scale=4 / 1e6)
        while offset < total:
            req = m.StateRequest(self.run, stage, iteration, offset, CHUNK_ELEMENTS)
            reply = await self.rpc.call(donor, req, self.settings.rpc_timeout_s)
            if not isinstance(reply, m.StateReply):
                raise ValueError(f"expected a StateReply, got {type(reply).__name__}")
            if (reply.stage, reply.iteration, reply.total_elements, reply.offset) != (stage, iteration, total, offset):
                raise ValueError("the donor's state does not match our stage layout or request")
            if counters is not None and counters != (reply.step_count, reply.adam_step, reply.pending):
                raise ValueError("the donor's state changed during the transfer")
            counters = (reply.step_count, reply.adam_step, reply.pending)
            if not -1 <= reply.pending < iteration:
                raise ValueError(f"the donor's pending update ({reply.pending}) is not before iteration {iteration}")
            if 0 <= reply.pending < epoch_start:
                raise NotReady(f"the donor's update of iteration {reply.pending} (the previous epoch) is in flight")
            n = min(CHUNK_ELEMENTS, total - offset)
            part = tensor_codec.decode(reply.tensor, expect_shape=(n,), expect_dtype="float32", what="state chunk")
            out[offset:offset + n] = part
            offset += n
            progress.update(offset)
        progress.finish()
        return out, *counters
