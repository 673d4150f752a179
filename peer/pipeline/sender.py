"""Sending a task's result on, with retries: to the next hop of the route a microbatch takes,
or to ourselves when we are that hop. A forward that the next hop cannot take is reported to
the caller (Undeliverable), who decides what recovery does; the sender only sends."""
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from opsweb.lifecycle import Lifecycle

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.schedule import Phase, Route, Schedule

from peer.compute import tensor_codec
from peer.pipeline import plan_view as pv
from peer.pipeline.flights import IterationState, Work
from peer.pipeline.inbox import Inbox
from peer.pipeline.ledger import Ledger
from peer.pipeline.settings import WorkerSettings
from peer.pipeline.spot_checks import SpotChecks
from peer.pipeline.wire import WireCompression
from peer.routing.health import Health
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

logger = logging.getLogger(__name__)
RETRYABLE = {ErrorCode.OVERLOADED, ErrorCode.STALE_SCHEDULE}
# a forward its next hop refuses as of another epoch goes to another replica after this long: a
# peer that has not read the epoch yet reads it at its next iteration boundary, but one that
# was stopped while the epoch was current may never see it (the DHT holds the newest schedule
# only): retried for the whole 30 s send deadline, each such forward cost an iteration 30 s
# (tests/swarm/test_churn.py, the stopped peer, in CI)
STALE_FORWARD_S = 3.0


@dataclass(frozen=True)
class Undeliverable:
    """A forward to a middle hop that `peer` did not take: another route may."""

    peer: str


class Sender:
    def __init__(self, me: str, run: str, rpc: RpcClient, health: Health, settings: WorkerSettings,
                 ledger: Ledger, inbox: Inbox, spot: SpotChecks, tasks: Lifecycle,
                 missed_after: Callable[[int], bool] = lambda epoch: False):
        self.me, self.run, self.rpc, self.health, self.settings = me, run, rpc, health, settings
        self.ledger, self.inbox, self.spot, self.tasks = ledger, inbox, spot, tasks
        self.missed_after = missed_after     # schedule_book.ScheduleBook.missed_after
        # what goes to each next hop: floats, or quantised per --wire-compression and the schedule
        self.wire = WireCompression(settings.wire_compression, rpc.versions, me)

    async def send_output(self, i: int, schedule: Schedule, route: Route, task: pv.TaskKey,
                          tensor: torch.Tensor, attempt: int, try_suspect: bool = False) -> Undeliverable | None:
        """Send a task's result to the next hop of `route`; Undeliverable when it is a forward
        that peer did not take (the head and backwards have nowhere else to go). `try_suspect`:
        call the next hop once even if it looks dead (recovery's last resort)."""
        dest = pv.destination(route, task)
        if dest is None:
            return None
        mb = route.microbatch_id
        nxt = pv.task_for_request(route, dest.peer, dest.phase, dest.hop_index)
        if dest.peer == self.me:  # e.g. a route that visits stage 0 only
            await self.inbox.put(i, nxt, Work(tensor, route, attempt, self.me))
            return None
        planned = schedule.route(mb)
        header = m.WorkHeader(self.run, schedule.epoch, i, mb, dest.hop_index, attempt,
                              None if route == planned else route)
        # a forward to a middle hop can go elsewhere; the head (at the origin) and backwards
        # cannot, so those keep trying a suspect peer until the send deadline
        recoverable = dest.phase == Phase.FORWARD and dest.hop_index < len(route.hops)
        if recoverable and not try_suspect and (self.health.suspect(dest.peer) or self.health.late(dest.peer)):
            ok = False  # known dead, or late with our work (hop deadlines): do not wait on it again
        else:
            if dest.phase == Phase.BACKWARD:
                # the scale a returned gradient is bounded by (and, for a head gradient, its gain)
                self.spot.bound.note(tensor, (i, mb) if task.kind == pv.Kind.HEAD else None)
            payload = tensor_codec.encode(tensor)
            request = (m.ForwardRequest if dest.phase == Phase.FORWARD else m.BackwardRequest)(header, payload)
            request, restored = self.wire.pack(request, tensor, schedule, dest.peer)
            # sampled: recomputed elsewhere from exactly what dest.peer decodes (floats or the
            # quantised tensor's values)
            checked = payload if restored is None else tensor_codec.encode(restored)
            self.spot.maybe_check(schedule, route, request, dest.peer, checked)
            ok = await self.send_with_retries(dest.peer, request, f"microbatch {mb} {nxt.kind.name}",
                                              give_up_when_suspect=recoverable,
                                              stale_deadline_s=STALE_FORWARD_S if recoverable else None)
        return Undeliverable(dest.peer) if not ok and recoverable else None

    async def send_with_retries(self, peer: str, request, what: str, deadline_s: float | None = None,
                                give_up_when_suspect: bool = True, stale_deadline_s: float | None = None) -> bool:
        """Deliver `request`, retrying back-pressure and transport errors (capped backoff)
        until the deadline (or until `peer` is suspect, when there is somewhere else to go);
        False (logged) if it never got in. `stale_deadline_s`: a shorter deadline once `peer`
        answered STALE_SCHEDULE (a forward that another replica can take)."""
        delay, attempts = 0.05, 0
        started = time.monotonic()
        deadline = started + (deadline_s or self.settings.send_deadline_s)
        while True:
            attempts += 1
            try:
                await self.rpc.call(peer, request, self.settings.rpc_timeout_s)
                self.health.record_success(peer)
                return True
            except RemoteError as exc:
                if exc.code == ErrorCode.DUPLICATE:
                    return True  # an earlier try got through
                if exc.code not in RETRYABLE or self._futile(exc, request):
                    logger.warning("%s rejected by %s: %s", what, peer[:12], exc)
                    return False
                if exc.code == ErrorCode.STALE_SCHEDULE and stale_deadline_s is not None:
                    deadline = min(deadline, started + stale_deadline_s)
                problem = str(exc)
            except TransportError as exc:
                problem = str(exc)
                self.health.record_failure(peer, self.replicas_of_peer(peer))
            gone = peer in self.health.departed or (give_up_when_suspect and self.health.suspect(peer))
            if gone or time.monotonic() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        logger.warning("%s: giving up on %s after %d attempt(s) (%s)", what, peer[:12], attempts, problem)
        return False

    def _futile(self, exc: RemoteError, request) -> bool:
        """A STALE_SCHEDULE that no retry cures: we keep the request's epoch because we read a
        newer one too late, and the peer runs that newer one. Retried, each send waited out its
        30 s deadline: with the origins on one epoch and the other stages on the next, the
        partition test's swarm stalled a minute an iteration until the coordinator's new epoch."""
        epoch = getattr(getattr(request, "header", request), "epoch", None)
        return exc.code == ErrorCode.STALE_SCHEDULE and epoch is not None and self.missed_after(epoch)

    def replicas_of_peer(self, peer: str) -> list[str]:
        """The replicas of `peer`'s stage in the running schedule (health never bans the last)."""
        schedule = self.ledger.current
        if schedule is None or peer not in schedule.stage_of():
            return []
        return pv.replicas(schedule, schedule.stage_of()[peer])

    def announce_done(self, i: int, schedule: Schedule, st: IterationState) -> None:
        """Origin: tell every other peer of the schedule that our microbatches of i ended."""
        done = m.IterationDone(self.run, schedule.epoch, i, m.MicrobatchCounts(**st.counts()))
        # a peer we take for departed gets it too (one try: send_with_retries gives up on the
        # departed at the first failure): one that was only stopped for a while and is back
        # would otherwise wait for it until it reads our progress record (lagging_origins.py)
        others = [p for p in schedule.stage_of() if p != self.me]
        for peer in others:  # in the background; a peer that misses it would wait the iteration out
            self.tasks.spawn(self.send_with_retries(peer, done, f"iteration {i} done", give_up_when_suspect=False))
