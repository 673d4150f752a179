"""Same-stage replica averaging: each replica sends its summed gradients and sample count to
the others; every replica adds all contributions in peer-id order, so all end bit-identical.

Normalisation is by the total samples that reached the stage (not by the replica count).
A replica that does not answer in time is left out of this iteration, and logged.

A replica steps once it holds every other replica's share; it does not wait for the acks of
its own (ShareDeliveries sends them in the background). The ack would not make replicas agree
when a share is lost: with two replicas, whoever misses the other's share averages alone either
way, and with more, leaving out a peer because our share to it failed only adds a third view.
Dropping it takes one link latency per iteration off the critical path (the farthest replica's
ack). A share that is refused (a replica sitting out a partition) still ends the wait for that
replica's share, as before, and a replica that looks dead is waited for only while our share
to it is still on its way (Outbound.gone).
"""
import asyncio
import logging
import time
import math
from dataclasses import dataclass
from typing import Awaitable, Callable, Coroutine

import torch

from protocol import messages as m
from protocol.messages import GradientShare
from protocol.schedule import Schedule
from protocol.spot_checks import SpotCheckReport

from peer.pipeline import plan_view as pv
from peer.pipeline.flights import IterationOutcome
from peer.pipeline.ledger import Ledger
from peer.pipeline.seat import StageSeat
from peer.pipeline.sender import Sender
from peer.pipeline.settings import WorkerSettings
from peer.pipeline.robust_shares import FACTOR as OUTLIER_FACTOR
from peer.pipeline.robust_shares import LeftOutRule, outliers, per_sample_norm
from peer.pipeline.share_codec import encode_share

logger = logging.getLogger(__name__)
SHARE_PATIENCE_MIN_S = 5.0        # a stopped replica holds our step up at most this long (or:)
SHARE_PATIENCE_ITERATIONS = 3     # this many of our typical iterations, when those are longer
# one we averaged without last time, still suspect: a few heartbeats, which clear the suspicion
# of a peer that is back (else it would send us its share while we step without it)
UNANSWERED_PATIENCE_S = 2.0


@dataclass(frozen=True)
class Contribution:
    vector: torch.Tensor
    samples: int
    loss_sum: float = 0.0


@dataclass(frozen=True)
class AveragingResult:
    vector: torch.Tensor
    samples: int
    loss_sum: float
    peers: tuple[str, ...]            # contributors, including ourselves
    missing: tuple[str, ...]


class ShareBox:
    """Shares received from other replicas, keyed by (iteration, stage)."""

    def __init__(self, max_pending_iterations: int = 3):
        self.max_pending = max_pending_iterations
        self._shares: dict[tuple[int, int], dict[str, Contribution]] = {}
        self._changed = asyncio.Condition()

    async def add(self, sender: str, share: GradientShare, vector: torch.Tensor) -> None:
        async with self._changed:
            box = self._shares.setdefault((share.iteration, share.stage), {})
            box[sender] = Contribution(vector, share.samples, share.loss_sum)
            self._changed.notify_all()

    async def wake(self) -> None:
        """Make waiting collect() calls re-evaluate `gone` now."""
        async with self._changed:
            self._changed.notify_all()

    async def collect(self, iteration: int, stage: int, senders: set[str], timeout: float,
                      gone: Callable[[str], bool] = lambda peer: False,
                      recheck_s: float = 0.5) -> dict[str, Contribution]:
        """Shares of `senders` for (iteration, stage), waiting until all arrived, `timeout`
        passed, or the missing ones are `gone` (re-evaluated every `recheck_s`)."""
        key = (iteration, stage)
        deadline = asyncio.get_running_loop().time() + timeout

        def complete() -> bool:
            have = set(self._shares.get(key, {}))
            return all(p in have or gone(p) for p in senders)

        async with self._changed:
            while not complete():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(min(left, recheck_s)):
                        await self._changed.wait_for(complete)
                except TimeoutError:
                    pass
            got = self._shares.pop(key, {})
            for old in [k for k in self._shares if k[0] <= iteration]:
                del self._shares[old]
            return {p: c for p, c in got.items() if p in senders}


def combine(contributions: dict[str, Contribution], expected: list[str]) -> AveragingResult:
    peers = tuple(sorted(contributions))
    total = None
    for peer in peers:  # fixed order: floating-point sums then agree on every replica
        v = contributions[peer].vector
        total = v.clone() if total is None else total.add_(v)
    return AveragingResult(
        vector=total, samples=sum(c.samples for c in contributions.values()),
        loss_sum=sum(contributions[p].loss_sum for p in peers), peers=peers,
        missing=tuple(p for p in expected if p not in contributions))


class Outbound:
    """Where our share to each replica stands: pending, delivered or refused."""

    def __init__(self, peers: list[str]):
        self.state = {p: "pending" for p in peers}

    def gone(self, peer: str, suspect: bool) -> bool:
        """Stop waiting for `peer`'s share? When it refused ours, or it looks dead after it took
        ours: while our share is pending, its delivery settles that (a delivery clears a
        suspicion, a failed one to a suspect peer ends in a refusal)."""
        state = self.state.get(peer, "delivered")
        return state == "refused" or (state == "delivered" and suspect)


class Patience:
    def __init__(self, seconds: float):
        self.until = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() > self.until


class ShareDeliveries:
    """Our gradient shares on their way to the other replicas, each delivered (with retries) in
    the background by `send(peer, share) -> delivered?`."""

    def __init__(self, send: Callable[[str, GradientShare], Awaitable[bool]], box: ShareBox,
                 spawn: Callable[[Coroutine], asyncio.Task] = asyncio.create_task):
        self.send, self.box = send, box
        self.spawn = spawn        # the work loop's lifecycle: its run() ends the deliveries too
        self._pending: set[asyncio.Task] = set()

    def start(self, peers: list[str], share: GradientShare) -> Outbound:
        out = Outbound(peers)
        for peer in peers:
            task = self.spawn(self._deliver(peer, share, out))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return out

    async def _deliver(self, peer: str, share: GradientShare, out: Outbound) -> None:
        try:
            delivered = await self.send(peer, share)
        except Exception:   # a bug, not the network: do not leave the replica waiting on us
            logger.exception("delivering gradient share %d to %s failed", share.iteration, peer[:12])
            delivered = False
        out.state[peer] = "delivered" if delivered else "refused"
        await self.box.wake()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout`) until every share is delivered or given up: before a peer
        leaves, its last shares must still reach the replicas waiting for them."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)

    def cancel(self) -> None:
        for task in list(self._pending):
            task.cancel()


@dataclass
class Pending:
    """Delayed exchange: our share of `iteration` is out, the average waits for the end of the
    next iteration (or a flush)."""
    iteration: int
    schedule: Schedule
    mine: Contribution
    outbound: Outbound


class GradientExchange:
    """The end of each iteration for our stage: our share out to the other replicas (in the
    background, through the sender), theirs in (`shares`, filled by the handlers), then the
    averaged step on the seat's runner.

    `delayed` (RunSpec.gradient_exchange "delayed"): iteration i's average is applied at the
    end of iteration i + 1, so its shares travel while i + 1 computes; iteration i trains with
    the parameters of the updates up to i - 2. A stage without other replicas steps at once.
    `pending` holds the exchange in flight; flush() applies it now (the worker does before a
    checkpoint, at the run's end and when the epoch changes, so a state copied to a joiner and
    a saved one have no update in flight)."""

    def __init__(self, me: str, run: str, settings: WorkerSettings, seat: StageSeat, ledger: Ledger,
                 sender: Sender, report: Callable[[SpotCheckReport], None] = lambda r: None,
                 delayed: bool = False):
        self.me, self.run, self.settings = me, run, settings
        self.seat, self.ledger, self.health = seat, ledger, sender.health
        self.delayed = delayed
        self._pending: Pending | None = None
        self.shares = ShareBox()
        self.left_out: set[str] = set()      # replicas whose shares robust_shares.outliers left out
        self.unanswered: set[str] = set()    # replicas we averaged without last time (no share came)
        self.bans = LeftOutRule()            # ... repeatedly: their shares are not taken any more
        self.report = report                 # published like a failed spot check (SpotChecks.add_report)
        self.deliveries = ShareDeliveries(
            lambda peer, share: sender.send_with_retries(peer, share, f"gradient share {share.iteration}"),
            self.shares, sender.tasks.spawn)

    def _share_patience(self) -> "Patience":
        """How long a replica that stopped answering our heartbeats may hold our step up while
        our share to it is still on its way (the RPC to a stopped peer hangs for its whole
        timeout): a few of our typical iterations, so that a peer stopped with SIGSTOP is
        left out in seconds, and a merely busy one, whose pings time out, still gets time."""
        return Patience(max(SHARE_PATIENCE_MIN_S, SHARE_PATIENCE_ITERATIONS * self.ledger.typical_iteration_s()))

    async def average_and_step(self, i: int, schedule: Schedule, outcome: IterationOutcome) -> int | None:
        """End of iteration `i`: our share out to the stage's other replicas; then (sync) average
        what arrived and step, or (delayed) step with the average of the exchange pending from
        the iteration before. Returns the iteration whose update was applied (None: none)."""
        seat, r = self.seat, self.seat.runner
        replicas = [p for p in pv.replicas(schedule, seat.stage) if p != self.me]
        mine = Contribution(await seat.compute(r.grad_vector), r.samples_this_step, outcome.loss_sum)
        if not replicas:
            if self.pending is not None:           # (an epoch change flushes before this already)
                await self.flush()                 # its step took our gradients along: put them back
                await seat.compute(r.set_grad_vector, mine.vector, mine.samples)
            stats = await seat.compute(r.step)
            seat.stepped_iteration = i
            logger.debug("iteration %d stage %d step: %s", i, seat.stage, stats)
            return i
        pending = Pending(i, schedule, *await self._share_out(i, schedule, mine, replicas))
        if not self.delayed or i == schedule.start_iteration:
            # an epoch's first iteration is synchronous: a replica that joins at it copies our
            # state of its start (nothing pending: the worker flushed) and we wait for its share
            await self.flush()
            await self._apply(pending)
            return i
        await seat.compute(r.abandon)              # our gradients are in the share: clear them
        applied = await self.flush()
        self.pending = pending
        return applied

    @property
    def pending(self) -> Pending | None:
        return self._pending

    @pending.setter
    def pending(self, value: Pending | None) -> None:
        self._pending = value
        self.seat.pending_iteration = None if value is None else value.iteration   # StateDonor reads it

    async def flush(self) -> int | None:
        """Apply the pending exchange now, if any; the iteration it was for."""
        pending = self.pending
        if pending is None:
            return None
        await self._apply(pending)
        self.pending = None
        return pending.iteration

    def drop_pending(self) -> None:
        """Forget the exchange in flight (we abandon our state: a rejoin or a new stage)."""
        self.pending = None

    def take_on(self, iteration: int, schedule: Schedule) -> None:
        """A replica's state came with `iteration`'s update still pending (StateReply.pending):
        take part in it with a zero share, so that we apply what the replicas apply."""
        zero = torch.zeros(self.seat.runner.num_parameters())
        replicas = [p for p in pv.replicas(schedule, self.seat.stage) if p != self.me]
        payload, scales, _ = encode_share(zero, self.settings.share_dtype)
        share = m.GradientShare(self.run, schedule.epoch, iteration, self.seat.stage, 0, payload, 0.0, scales)
        self.pending = Pending(iteration, schedule, Contribution(zero, 0), self.deliveries.start(replicas, share))

    async def _share_out(self, i: int, schedule: Schedule, mine: Contribution,
                         replicas: list[str]) -> tuple[Contribution, Outbound]:
        """Our share (as the replicas decode it: all combine the same vectors) on its way, in
        the background (no ack wait); a banned replica still gets ours: not to stall it."""
        payload, scales, vector = await self.seat.compute(encode_share, mine.vector, self.settings.share_dtype)
        share = m.GradientShare(self.run, schedule.epoch, i, self.seat.stage, mine.samples, payload,
                                mine.loss_sum, scales)
        return Contribution(vector, mine.samples, mine.loss_sum), self.deliveries.start(replicas, share)

    async def _apply(self, pending: Pending) -> None:
        """Wait for the other replicas' shares of `pending`, average, step."""
        seat, r, i, schedule = self.seat, self.seat.runner, pending.iteration, pending.schedule
        others = [p for p in pv.replicas(schedule, seat.stage) if p != self.me and p not in self.bans.banned]
        # replicas may legitimately still be working: wait as long as an iteration may take,
        # but not for one that died (its gradients died with it) or would not take ours
        self.ledger.awaiting_shares = set(others)  # recovery heartbeats them while we wait
        patience, brief = self._share_patience(), Patience(UNANSWERED_PATIENCE_S)
        if i == schedule.start_iteration:
            # a new epoch's first iteration: a replica joining or rejoining takes our state
            # of this boundary while we wait for its share, so we wait as long as it takes
            patience = brief = Patience(float("inf"))
        outbound = pending.outbound

        def given_up(p: str) -> bool:
            suspect = self.health.suspect(p)
            return outbound.gone(p, suspect) or (suspect and (
                patience.expired() or (p in self.unanswered and brief.expired())))
        try:
            got = await self.shares.collect(i, seat.stage, set(others), self.settings.iteration_timeout_s,
                                            gone=given_up)
        finally:
            self.ledger.awaiting_shares = set()
        contributions = {**got, self.me: pending.mine}
        poisoned = await seat.compute(outliers, {p: (c.vector, c.samples) for p, c in contributions.items()},
                                      self.me)
        kept = {p: c for p, c in contributions.items() if p not in poisoned}
        # two replicas, both shares left out: neither can judge the other (robust_shares), so a
        # tie counts apart towards a ban (LeftOutRule), and so does a pair of broken shares
        tie = not kept and len(contributions) == 2
        if not kept:                # (ours is among the contributions: so something was left out)
            if tie:
                logger.warning("iteration %d: the two replicas' gradient shares differ over %gx per sample (or "
                               "neither is finite) and neither can tell which is wrong: both leave out both, "
                               "this stage skips the step", i, OUTLIER_FACTOR)
            else:
                logger.warning("iteration %d: every gradient share was left out, ours included: this stage "
                               "skips the step", i)
            kept = {self.me: Contribution(torch.zeros_like(pending.mine.vector), 0, 0.0)}
        elif poisoned:
            logger.warning("iteration %d: left out the gradient share(s) of %s: per-sample norm over %gx the "
                           "replicas' typical one (a broken or poisoned replica)", i,
                           [p[:12] for p in sorted(poisoned)], OUTLIER_FACTOR)
        self.left_out.update(poisoned)
        self._ban_repeated(schedule, i, contributions, poisoned, tie)
        result = combine(kept, [self.me, *others])
        # a replica still silent after we averaged without it is not waited for again
        self.unanswered = set(result.missing) - set(got)
        absent = [p for p in result.missing if p not in contributions]   # (left-out ones: said above)
        if absent:
            logger.warning("iteration %d: no gradients from replica(s) %s; averaging without them",
                           i, [p[:12] for p in absent])
        seat.stepping = True       # the parameters change: a state request waits (StateDonor)
        try:
            await seat.compute(r.set_grad_vector, result.vector, result.samples)
            stats = await seat.compute(r.step)
            seat.stepped_iteration = i
        finally:
            seat.stepping = False
        logger.debug("iteration %d stage %d step: %s", i, seat.stage, stats)

    def _ban_repeated(self, schedule: Schedule, i: int, contributions: dict[str, Contribution],
                      poisoned: set[str], tie: bool) -> None:
        """LeftOutRule over the other replicas whose shares came; report those banned now."""
        senders = set(contributions) - {self.me}
        for peer in sorted(self.bans.observe(senders, poisoned & senders, tie)):
            own = per_sample_norm(contributions[self.me].vector, contributions[self.me].samples)
            theirs = per_sample_norm(contributions[peer].vector, contributions[peer].samples)
            ratio = theirs / own if own > 0 and math.isfinite(theirs) else 1e300
            logger.warning("replica %s is banned here: %s (now %.3g times our per-sample norm); its shares are "
                           "no longer taken", peer, self.bans.reason(peer), ratio)
            self.report(SpotCheckReport(peer, self.me, schedule.epoch, i, 0, self.seat.stage, ratio, False,
                                        kind="share"))
