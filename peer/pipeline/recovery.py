"""Mid-iteration recovery: what a peer does when the peer it handed a microbatch to is gone.

Each live peer is responsible for its immediate successor on every microbatch it holds
activations for: it watches that peer (heartbeats while it owes us a backward, failed sends,
and the flight's hop deadline: hop_deadlines.py) and, once the peer is suspect or late
(routing/health.py), re-sends its own stashed output on a
repaired route (routing/fallback.py: reroute to a replica, else skip the stage, else ask the
origin to re-issue on a fresh route, else the origin counts it lost and says so).

Backward after a lost hop ("replay"): the microbatch is replayed forward from the last live
hop with a higher attempt number, through the replacement, to the head and back. Stages behind
the lost hop that had already run this microbatch's backward pass only pass gradients on
during the replay (they counted it once already), so every stage that the final route visits
gets this microbatch's gradient exactly once, computed from the same parameters. Gradients a
dead peer had accumulated die with it: its stage averages over its surviving replicas.
"""
import asyncio
import logging
import random
import time
from typing import Callable

import torch

from opsweb.lifecycle import Lifecycle

from protocol import messages as m
from protocol.schedule import Route, Schedule

from peer.pipeline import plan_view as pv
from peer.pipeline.flights import Flight, IterationState, Work, next_attempt
from peer.pipeline.hop_deadlines import DeadlinePolicy, HopDeadlines
from peer.pipeline.ledger import Ledger
from peer.pipeline.seat import StageSeat
from peer.pipeline.sender import Sender
from peer.pipeline.settings import WorkerSettings
from peer.routing import fallback
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError
from swarmcore.outcomes import Outcome

logger = logging.getLogger(__name__)
HOLD_LOOKS = 6          # pings of the silent replicas before a held microbatch counts lost
HOLD_PAUSE_S = 1.0      # between them (each ping waits up to ping_timeout_s more): ~6-18 s in all
MAX_HOLDS = 2           # per microbatch and iteration


class Recovery:
    def __init__(self, me: str, run: str, settings: WorkerSettings, seat: StageSeat, ledger: Ledger,
                 sender: Sender, tasks: Lifecycle, on_late: Callable[[tuple[str, ...]], None] | None = None):
        self.me, self.run, self.settings = me, run, settings
        self.seat, self.ledger, self.sender, self.tasks = seat, ledger, sender, tasks
        self.health = sender.health
        self.deadlines = HopDeadlines(DeadlinePolicy(floor_s=settings.hop_deadline_floor_s))
        self.on_late = on_late                      # our advert names the late peers (app.py)
        self.events: list[str] = []                 # recent recoveries, for status output
        self.deadline_misses = 0                    # for /metrics

    def _note(self, text: str) -> None:
        logger.warning(text)
        self.events = (self.events + [text])[-20:]

    # ---- watching the peers that owe us work ----

    async def deliver(self, i: int, schedule: Schedule, route: Route, task: pv.TaskKey,
                      tensor: torch.Tensor, attempt: int, try_suspect: bool = False) -> None:
        """Send a task's result on; a forward its next hop does not take is repaired here."""
        failed = await self.sender.send_output(i, schedule, route, task, tensor, attempt, try_suspect)
        if failed is not None:
            await self.next_hop_failed(i, route.microbatch_id, failed.peer, attempt)
            return
        st = self.ledger.get(i) if task.kind.is_forward else None
        flight = None if st is None else st.flights.get(route.microbatch_id)
        if flight is not None and flight.attempt == attempt and not flight.sent_at:
            flight.sent_at = time.monotonic()   # taken: its hop deadline runs from now

    def returned(self, flight: Flight) -> None:
        """A flight's gradient came back: its time sets the deadlines of those after it."""
        if flight.sent_at and flight.returned_at:
            self.deadlines.completed(flight.returned_at - flight.sent_at, flight.hops_ahead)

    def watched(self) -> set[str]:
        schedule, runner = self.ledger.current, self.seat.runner
        if schedule is None or runner is None:
            return set()
        st = self.ledger.in_hand()
        peers = set(self.ledger.awaiting_shares)
        if st is not None:
            peers |= {f.successor for f in st.flights.values()}
            if not runner.is_origin:
                peers |= {o for o in pv.replicas(schedule, 0) if o not in st.done_origins}
        peers.discard(self.me)
        return peers

    async def monitor(self) -> None:
        """Heartbeat the peers we wait on; recover the work of those that stopped answering."""
        last_round = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            last_round = self._discount_our_stall(last_round)
            try:
                # a peer that took a call of ours since the last round is alive: no ping
                peers = [p for p in self.watched()
                         if not self.health.answered_within((p,), self.settings.heartbeat_s)]
                await asyncio.gather(*(self._ping(p) for p in peers))
                await self._recover_suspects()
            except asyncio.CancelledError:
                raise
            except Exception:  # the monitor must outlive any one bad round
                logger.exception("recovery monitor round failed")

    def _discount_our_stall(self, last_round: float) -> float:
        """Time this process did not run (stopped, starved of CPU) is no successor's delay: the
        hop deadlines of the flights in hand move on by it. A peer resumed after SIGSTOP took
        every successor for late at once."""
        now = time.monotonic()
        stalled = now - last_round - self.settings.heartbeat_s
        st = self.ledger.in_hand()
        if stalled > 1.0 and st is not None:
            for flight in st.flights.values():
                if flight.sent_at:
                    flight.sent_at += stalled
        return now

    async def _ping(self, peer: str) -> None:
        try:
            await self.sender.rpc.call(peer, m.Ping(random.getrandbits(32)), self.settings.ping_timeout_s)
            self.health.record_success(peer)
        except (TransportError, RemoteError):
            self.health.record_failure(peer, self.sender.replicas_of_peer(peer))

    async def _recover_suspects(self) -> None:
        i, st = self.ledger.iteration, self.ledger.in_hand()
        if st is None:
            return
        now = time.monotonic()
        for mb, flight in list(st.flights.items()):
            if flight.successor == self.me:
                continue
            overdue = not self.health.suspect(flight.successor) and self._overdue(flight, now)
            if overdue:
                self._mark_late(i, mb, flight, now)
            # (its gradient came: done; sent there as the last resort: only its own deadline counts)
            late = (self.health.late(flight.successor) and not flight.returned_at
                    and (overdue or not flight.last_resort))
            if self.health.suspect(flight.successor) or late:
                await self.next_hop_failed(i, mb, flight.successor)

    def _overdue(self, flight: Flight, now: float) -> bool:
        """Past its hop deadline, with its gradient not back, held by a peer we can route
        around (the origin's head cannot go elsewhere: its watchers are the origins' own)."""
        return (not flight.returned_at and not flight.holding and flight.successor != flight.route.origin
                and self.deadlines.overdue(flight.sent_at, flight.hops_ahead, now))

    def _mark_late(self, i: int, mb: int, flight: Flight, now: float) -> None:
        peer = flight.successor
        self._note(f"iteration {i} microbatch {mb}: {peer[:12]} missed its hop deadline "
                   f"({now - flight.sent_at:.1f}s with {flight.hops_ahead} hop(s) ahead; "
                   f"{self.deadlines.describe()}): routing around it for {self.settings.hop_late_s:.0f}s")
        self.health.mark_late(peer, self.settings.hop_late_s)
        self.deadline_misses += 1
        if self.on_late is not None:
            self.on_late(self.health.late_peers())

    # ---- the rules, applied ----

    def _not_departed(self, peer: str) -> bool:
        """The fallback when no peer looks healthy: any peer still announced that has not
        failed for long (under heavy load heartbeats time out although peers are alive)."""
        h = self.health
        return peer not in h.departed and h.failures(peer) < 2 * h.suspect_after

    @staticmethod
    def _untried(flight, usable):
        return lambda peer: peer not in flight.refused and usable(peer)

    def _last_resort(self, flight):
        """Peers to try when none looks healthy: announced, not failing for long, and not
        failed by this flight twice while they looked dead."""
        return lambda peer: flight.failed[peer] < 2 and self._untried(flight, self._not_departed)(peer)

    def _budget(self, schedule: Schedule, mb: int) -> fallback.Budget:
        return fallback.budget_for(schedule.route(mb), schedule.num_stages, schedule.skip_ratio,
                                   self.settings.extra_skips)

    async def next_hop_failed(self, i: int, mb: int, dead: str, attempt: int | None = None) -> None:
        """The successor of our flight `mb` cannot take it (the send of `attempt`, if given):
        repair the rest of the route."""
        st, schedule, health = self.ledger.get(i), self.ledger.current, self.health
        flight = None if st is None else st.flights.get(mb)
        if flight is None or flight.successor != dead or schedule is None or flight.holding:
            return  # already recovered, finished meanwhile, or held until a replica answers
        if attempt is not None and attempt != flight.attempt:
            # an older attempt's send, still retrying through a dying relay, reached the peer
            # after the flight was sent again and was refused as stale: the newer one stands
            # (taking it for the newer one's failure lost both microbatches of an iteration, test_nat)
            return
        hop = flight.hop_index + 1
        if hop >= len(flight.route.hops):
            self._note(f"iteration {i} microbatch {mb}: its origin {dead[:12]} is unreachable")
            return
        if health.suspect(dead) or (health.late(dead) and not flight.last_resort):
            # a dropped connection (a relay that died mid-stream) may well take it on a new one,
            # and a late peer is not one that refused: where no other replica can take the flight
            # (and no skip is left) the last resort gives it to that peer once more. Counted as
            # refused, a stage whose sole replica was late lost every microbatch at once for
            # hop_late_s (CI51: 0.3 s iterations, all lost)
            flight.failed[dead] += 1
        else:   # it answered and would not take it, or was its last resort and kept it too long
            flight.refused.add(dead)
        decision = fallback.recover_hop(flight.route, hop, lambda s: pv.replicas(schedule, s),
                                        self._untried(flight, health.usable), self._budget(schedule, mb))
        last_resort = decision.action == fallback.Action.REISSUE
        if last_resort:                # rather a slow-looking replica than none
            decision = fallback.recover_hop(flight.route, hop, lambda s: pv.replicas(schedule, s),
                                            self._last_resort(flight), self._budget(schedule, mb))
        if decision.action == fallback.Action.REISSUE:
            if self.seat.runner.is_origin:
                await self.reissue(i, mb, decision.detail)
            else:
                st.flights.pop(mb, None)
                self.seat.runner.drop((i, mb))
                await self._ask_origin(i, schedule, flight.route, flight.upstream_attempt, dead, decision.detail)
            return
        self._note(f"iteration {i} microbatch {mb}: {decision.action.value}: {decision.detail}")
        await self._resend(i, schedule, st, mb, decision.route, try_suspect=last_resort)

    async def _resend(self, i: int, schedule: Schedule, st: IterationState, mb: int, route,
                      try_suspect: bool = False) -> None:
        flight = st.flights[mb]
        out = await self.seat.compute(self.seat.runner.stashed_output, (i, mb))
        flight.attempt = next_attempt(max(flight.attempt, st.seen.get((mb, pv.Kind.FORWARD), 0)), flight.hop_index)
        flight.route = route
        flight.last_resort = try_suspect
        flight.sent_at = flight.returned_at = 0.0   # its hop deadline restarts once the new hop takes it
        hop = flight.hop_index
        flight.successor = pv.next_hop(route, hop)
        kind = pv.Kind.ORIGIN_FORWARD if hop == 0 else pv.Kind.FORWARD
        self.tasks.spawn(self.deliver(i, schedule, route, pv.TaskKey(mb, kind, hop), out, flight.attempt,
                                      try_suspect))

    async def reissue(self, i: int, mb: int, why: str) -> None:
        """Origin only: send microbatch `mb` again from stage 0 on a fresh route."""
        st, schedule = self.ledger.get(i), self.ledger.current
        entry = None if st is None else st.own.get(mb)
        if entry is None or entry.outcome is not None or mb not in st.flights or st.flights[mb].holding:
            return
        flight = st.flights[mb]
        route, last_resort = self._fresh_route(schedule, entry, flight)
        if route is None and flight.holds < MAX_HOLDS and self._silent(schedule, flight):
            flight.holding, flight.holds = True, flight.holds + 1
            self.tasks.spawn(self._hold(i, mb, why), f"holding microbatch {mb} of iteration {i}")
            return
        if route is None:
            self.lose(i, st, mb, f"{why}; no fresh route either")
            return
        await self._reissue_on(i, schedule, st, mb, route, last_resort, why)

    async def _reissue_on(self, i: int, schedule: Schedule, st: IterationState, mb: int, route: Route,
                          last_resort: bool, why: str) -> None:
        st.own[mb].reissued = True
        self._note(f"iteration {i} microbatch {mb}: reissued from stage 0 ({why}) via "
                   f"{[h.stage for h in route.hops]}")
        await self._resend(i, schedule, st, mb, route, try_suspect=last_resort)

    def _fresh_route(self, schedule: Schedule, entry, flight) -> tuple[Route | None, bool]:
        """A fresh route for an origin's microbatch, and whether it needed the last resort."""
        def route_among(usable):
            return fallback.fresh_route(entry.planned, schedule.num_stages, lambda s: pv.replicas(schedule, s),
                                        usable, self._budget(schedule, entry.planned.microbatch_id))
        route = route_among(self._untried(flight, self.health.usable))
        if route is not None:
            return route, False
        return route_among(self._last_resort(flight)), True   # rather slow-looking peers than none

    def _silent(self, schedule: Schedule, flight) -> list[str]:
        """Scheduled peers that could carry the flight but did not answer: still announced, never
        refused it, yet failing (a relay reconnecting, a stopped process). Not the departed."""
        h = self.health
        return [p for p in schedule.stage_of() if p != self.me and p not in h.departed
                and p not in flight.refused and (not h.usable(p) or flight.failed[p] >= 2)]

    async def _hold(self, i: int, mb: int, why: str) -> None:
        """No route now, but silent peers that could carry it are still announced: ping them a
        few times before counting the microbatch lost. Losing it at once sent the origin on to
        the next iteration, which lost its microbatches too, iteration after iteration, while a
        relay reconnected for ~3 s (tests/swarm/test_nat.py)."""
        self._note(f"iteration {i} microbatch {mb}: {why}; holding it while the silent replicas "
                   f"are pinged (up to {HOLD_LOOKS} looks)")
        st = self.ledger.get(i)
        for _ in range(HOLD_LOOKS):
            await asyncio.sleep(HOLD_PAUSE_S)
            flight, schedule = st.flights.get(mb), self.ledger.current
            if self.ledger.get(i) is not st or flight is None or st.own[mb].outcome is not None or schedule is None:
                return                 # the iteration ended (timed out) meanwhile
            silent = self._silent(schedule, flight)
            await asyncio.gather(*(self._ping(p) for p in silent))
            for peer in silent:
                if self.health.usable(peer):
                    del flight.failed[peer]     # it answers now: try it again
            route, last_resort = self._fresh_route(schedule, st.own[mb], flight)
            if route is not None:
                flight.holding = False
                await self._reissue_on(i, schedule, st, mb, route, last_resort, why)
                return
            if not silent:
                break
        flight.holding = False
        self.lose(i, st, mb, f"{why}; no fresh route either, and no silent replica answered")

    def lose(self, i: int, st: IterationState, mb: int, why: str) -> None:
        entry = st.own[mb]
        if entry.outcome is None:
            entry.outcome = Outcome.LOST
            st.flights.pop(mb, None)
            self.seat.runner.drop((i, mb))
            self._note(f"iteration {i} microbatch {mb} LOST: {why}")

    async def _ask_origin(self, i: int, schedule: Schedule, route, attempt: int, dead: str, why: str) -> None:
        header = m.WorkHeader(self.run, schedule.epoch, i, route.microbatch_id, 0, attempt, route)
        self._note(f"iteration {i} microbatch {route.microbatch_id}: asking origin {route.origin[:12]} "
                   f"to re-issue it ({why})")
        ok = await self.sender.send_with_retries(route.origin, m.MicrobatchFailed(header, dead, why),
                                            f"re-issue request for microbatch {route.microbatch_id}")
        if not ok:
            logger.error("iteration %d microbatch %d: could not reach its origin", i, route.microbatch_id)

    async def compute_failed(self, i: int, schedule: Schedule, st: IterationState, mb: int,
                             work: Work, why: str) -> None:
        """Our own compute refused a microbatch (e.g. non-finite values): it cannot be
        recovered by routing, so its origin counts it lost and reports it."""
        if self.seat.runner.is_origin:
            if mb in st.own:
                self.lose(i, st, mb, why)
            return
        await self._ask_origin(i, schedule, work.route, work.attempt, "", f"compute failed: {why}")

    async def on_failed_report(self, remote: str, report: m.MicrobatchFailed) -> None:
        """Origin side of MicrobatchFailed (already validated by the handler)."""
        i, mb = report.header.iteration, report.header.microbatch_id
        st = self.ledger.get(i)
        if st is None or mb not in st.own:
            return
        if not report.dead_peer:
            self.lose(i, st, mb, f"{remote[:12]} reported: {report.reason}")
            return
        self.health.record_failure(report.dead_peer, self.sender.replicas_of_peer(report.dead_peer))
        await self.reissue(i, mb, f"{remote[:12]} reported {report.dead_peer[:12]} unusable")
