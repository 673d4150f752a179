"""Recovery does not hand a microbatch back to a peer that already refused it this iteration (and
holds one whose only carriers fell silent, below):
two stage replicas that both replied ITERATION_OVER (they had caught up past the iteration) once
bounced it between them until the iteration timed out, 120 s (issue 25, the storm bench). Last,
a flight past its hop deadline (peer/pipeline/hop_deadlines.py)."""
import asyncio
import time
from types import SimpleNamespace

import pytest

from protocol.schedule import Hop, Route, Schedule, StageAssignment

from peer.pipeline.flights import Flight, IterationState, OriginEntry
from peer.pipeline.recovery import Recovery
from peer.pipeline.settings import WorkerSettings
from swarmcore.outcomes import Outcome

ROUTE = Route(0, (Hop(0, "o"), Hop(1, "a"), Hop(2, "c")))
SCHEDULE = Schedule("r", 1, "full", 3, 0.0, (StageAssignment("o", 0), StageAssignment("a", 1),
                                            StageAssignment("b", 1), StageAssignment("c", 2)), (ROUTE,))


class Runner:
    is_origin = True

    def stashed_output(self, key):
        return "activations"

    def drop(self, key):
        return True


async def compute(fn, *args):
    return fn(*args)


SEAT = SimpleNamespace(runner=Runner(), compute=compute)


def iteration_5(route: Route, schedule: Schedule):
    """Iteration 5's state with our microbatch 0 in flight to route's second hop, and its ledger."""
    st = IterationState(5)
    st.flights[0] = Flight(route, 0, 0, route.hops[1].peer)
    st.own[0] = OriginEntry(route)
    return st, SimpleNamespace(current=schedule, get=lambda i: st if i == 5 else None)


def recovery(suspect=frozenset()):
    st, ledger = iteration_5(ROUTE, SCHEDULE)
    health = SimpleNamespace(usable=lambda peer: peer not in suspect, departed=set(), failures=lambda peer: 0,
                             suspect_after=3, suspect=lambda peer: peer in suspect, late=lambda peer: False)
    sent = []

    def spawn(coro, what=""):
        sent.append(coro.cr_frame.f_locals["route"])   # where the microbatch is sent next
        coro.close()
    rec = Recovery("o", "r", WorkerSettings(extra_skips=1), SEAT, ledger, SimpleNamespace(health=health),
                   SimpleNamespace(spawn=spawn))
    return rec, st, sent


def test_a_microbatch_refused_by_both_replicas_is_not_bounced_between_them():
    rec, st, sent = recovery()
    asyncio.run(rec.next_hop_failed(5, 0, "a"))
    assert [h.peer for h in sent[-1].hops] == ["o", "b", "c"]          # rerouted to the other replica
    asyncio.run(rec.next_hop_failed(5, 0, "b"))
    assert len(sent) == 1                                               # not back to "a"
    assert st.own[0].outcome == Outcome.LOST and 0 not in st.flights    # k = 0: nothing to skip to


def test_a_peer_whose_connection_dropped_is_tried_again_when_no_other_replica_is_left():
    """A relay that died mid-stream (issue 28) closes the connection: the peer did not refuse,
    it is suspect; with its stage's other replica refusing, it gets the microbatch again."""
    rec, st, sent = recovery(suspect={"a"})
    asyncio.run(rec.next_hop_failed(5, 0, "a"))                         # dropped: "b" is healthy
    assert [h.peer for h in sent[-1].hops] == ["o", "b", "c"]
    asyncio.run(rec.next_hop_failed(5, 0, "b"))                         # "b" refused
    assert [h.peer for h in sent[-1].hops] == ["o", "a", "c"]          # back to "a", not lost
    assert st.own[0].outcome is None


def test_an_older_attempt_refused_as_stale_does_not_fail_the_newer_one():
    """Sent again (attempt 64) while the first send (attempt 0) still retried through a dying
    relay: the first then reached the peer, which refused it as stale. That is no failure of
    attempt 64, which the peer holds; taking it for one lost both microbatches of an iteration
    (tests/swarm/test_nat.py)."""
    rec, st, sent = recovery(suspect={"a"})
    asyncio.run(rec.next_hop_failed(5, 0, "a"))                         # sent again, to "b"
    flight = st.flights[0]
    assert flight.successor == "b" and flight.attempt > 0 and len(sent) == 1
    asyncio.run(rec.next_hop_failed(5, 0, "b", attempt=0))              # the old send's refusal
    assert len(sent) == 1 and "b" not in flight.refused and st.own[0].outcome is None
    asyncio.run(rec.next_hop_failed(5, 0, "b", attempt=flight.attempt))  # the new one's: recovered
    assert len(sent) == 2 and "b" in flight.refused


SOLE = Route(0, (Hop(0, "o"), Hop(1, "a")))
SOLE_SCHEDULE = Schedule("r", 1, "full", 2, 0.0, (StageAssignment("o", 0), StageAssignment("a", 1)), (SOLE,))


async def hold_scenario(monkeypatch, answers_after: int, departed=(), cycles: int = 0):
    """Stage 1's sole replica "a" fell silent: its pings fail `answers_after` times, then work;
    `cycles` more times, the microbatch sent to it fails twice again. Returns (state, routes
    sent, pings)."""
    from peer.pipeline import recovery as recovery_module
    from peer.routing.health import Health
    from peer.transport.base import TransportError
    monkeypatch.setattr(recovery_module, "HOLD_PAUSE_S", 0.01)
    st, ledger = iteration_5(SOLE, SOLE_SCHEDULE)
    health = Health()
    health.set_departed(departed)
    pings = []

    async def call(peer, request, timeout):
        pings.append(peer)
        if len(pings) <= answers_after:
            raise TransportError(peer, "no route to the relay")
    sent, tasks = [], []

    def spawn(coro, what=""):
        if coro.cr_code.co_name == "deliver":
            sent.append(coro.cr_frame.f_locals["route"])
            coro.close()
        else:
            tasks.append(asyncio.ensure_future(coro))
    rec = Recovery("o", "r", WorkerSettings(extra_skips=0, ping_timeout_s=1.0),
                   SEAT, ledger,
                   SimpleNamespace(health=health, rpc=SimpleNamespace(call=call), replicas_of_peer=lambda peer: [peer]),
                   SimpleNamespace(spawn=spawn))

    async def fail_twice():
        for _ in range(health.suspect_after):
            health.record_failure("a", ["a"])
        await rec.next_hop_failed(5, 0, "a")      # the last resort: "a" once more
        await rec.next_hop_failed(5, 0, "a")      # failed twice: no route now
        while tasks:
            await tasks.pop()
    for _ in range(1 + cycles):
        await fail_twice()
    return st, sent, pings


def test_a_microbatch_whose_sole_replica_fell_silent_is_held_until_it_answers(monkeypatch):
    """A relay that died leaves the only stage-1 peer silent for ~3 s (tests/swarm/test_nat.py):
    losing the microbatch at once sent the origin on, losing every iteration meanwhile."""
    st, sent, pings = asyncio.run(hold_scenario(monkeypatch, answers_after=2))
    assert pings == ["a"] * 3 and st.own[0].outcome is None and st.own[0].reissued
    assert len(sent) == 2 and [h.peer for h in sent[-1].hops] == ["o", "a"]    # sent again once it answered
    assert not st.flights[0].holding


def test_a_held_microbatch_is_lost_after_its_looks_and_a_departed_replica_is_not_waited_for(monkeypatch):
    from peer.pipeline.recovery import HOLD_LOOKS
    st, sent, pings = asyncio.run(hold_scenario(monkeypatch, answers_after=100))
    assert len(pings) == HOLD_LOOKS and st.own[0].outcome == Outcome.LOST and len(sent) == 1
    st, sent, pings = asyncio.run(hold_scenario(monkeypatch, answers_after=0, departed={"a"}))
    assert pings == [] and st.own[0].outcome == Outcome.LOST



def test_a_replica_that_answers_pings_but_fails_every_send_is_held_at_most_twice(monkeypatch):
    """Held, pinged (it answers), sent again, failed again, ...: bounded, not until the timeout."""
    from peer.pipeline.recovery import MAX_HOLDS
    st, sent, pings = asyncio.run(hold_scenario(monkeypatch, answers_after=0, cycles=MAX_HOLDS))
    assert len(pings) == MAX_HOLDS and st.own[0].outcome == Outcome.LOST


def test_a_flight_overdue_at_its_successor_is_rerouted_and_the_successor_marked_late():
    from peer.routing.health import Health
    st, ledger = iteration_5(ROUTE, SCHEDULE)
    ledger.iteration, ledger.in_hand = 5, lambda: st
    late_named, sent = [], []

    def spawn(coro, what=""):
        sent.append(coro.cr_frame.f_locals["route"])
        coro.close()
    health = Health()
    rec = Recovery("o", "r", WorkerSettings(extra_skips=1, hop_deadline_floor_s=1.0), SEAT, ledger,
                   SimpleNamespace(health=health), SimpleNamespace(spawn=spawn), late_named.append)
    for _ in range(4):
        rec.deadlines.completed(0.3, 3)                  # 0.1 s per hop: 1.3 s per hop ahead
    flight, now = st.flights[0], time.monotonic()
    late = flight.successor
    flight.sent_at = now - 3.0                           # 3 hops ahead: due within 3.9 s
    asyncio.run(rec._recover_suspects())
    assert not sent and not health.late(late)
    # our own process stopped 5 s (a monitor round that came 5 s late): not the successor's delay
    rec._discount_our_stall(now - 5.5)
    assert flight.sent_at == pytest.approx(now + 2.0, abs=0.1)
    flight.sent_at = now - 4.0
    asyncio.run(rec._recover_suspects())
    assert health.late(late) and late_named == [(late,)]
    assert len(sent) == 1 and late not in [h.peer for h in sent[0].hops]


def test_a_sole_replica_marked_late_gets_the_flight_once_more_as_the_last_resort():
    """Stage 1's only replica "a" was marked late (hop deadlines) and is routed around for
    hop_late_s, but there is no way around it: a flight for it goes to it once more (its send
    tries a peer that looks bad), and the monitor leaves that flight to its own hop deadline
    rather than failing it at once for the earlier lateness. Counting a late peer as refused
    lost every microbatch at once for 15 s (CI51, CI53). Past its deadline, the last resort is
    refused: lost, not sent to it again."""
    from peer.routing.health import Health
    st, ledger = iteration_5(SOLE, SOLE_SCHEDULE)
    ledger.iteration, ledger.in_hand = 5, lambda: st
    sent = []

    def spawn(coro, what=""):
        sent.append((coro.cr_frame.f_locals["route"], coro.cr_frame.f_locals["try_suspect"]))
        coro.close()
    health = Health()
    health.mark_late("a", 15.0)
    rec = Recovery("o", "r", WorkerSettings(extra_skips=0, hop_deadline_floor_s=1.0), SEAT, ledger,
                   SimpleNamespace(health=health), SimpleNamespace(spawn=spawn))
    asyncio.run(rec.next_hop_failed(5, 0, "a"))         # the sender skipped it: late
    assert [([h.peer for h in r.hops], t) for r, t in sent] == [(["o", "a"], True)]
    flight = st.flights[0]
    assert st.own[0].outcome is None and "a" not in flight.refused and flight.last_resort
    for _ in range(4):
        rec.deadlines.completed(0.3, 2)                # deadlines on: ~1 s per hop ahead
    flight.sent_at = time.monotonic() - 0.5            # taken, within its deadline
    asyncio.run(rec._recover_suspects())
    assert len(sent) == 1 and st.own[0].outcome is None   # "a" is still late, yet the flight waits
    flight.sent_at = time.monotonic() - 30             # kept past its deadline
    asyncio.run(rec._recover_suspects())
    assert len(sent) == 1 and "a" in flight.refused and st.own[0].outcome == Outcome.LOST
