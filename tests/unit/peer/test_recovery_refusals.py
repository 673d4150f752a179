"""Recovery does not hand a microbatch back to a peer that already refused it this iteration:
two stage replicas that both replied ITERATION_OVER (they had caught up past the iteration) once
bounced it between them until the iteration timed out, 120 s (issue 25, the storm bench)."""
import asyncio
from types import SimpleNamespace

from protocol.schedule import Hop, Route, Schedule, StageAssignment

from peer.pipeline.flights import Flight, IterationState, OriginEntry
from peer.pipeline.recovery import Recovery
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


def recovery(suspect=frozenset()):
    st = IterationState(5)
    st.flights[0] = Flight(ROUTE, 0, 0, "a")
    st.own[0] = OriginEntry(ROUTE)
    ledger = SimpleNamespace(current=SCHEDULE, get=lambda i: st if i == 5 else None)

    async def compute(fn, *args):
        return fn(*args)
    seat = SimpleNamespace(runner=Runner(), compute=compute)
    health = SimpleNamespace(usable=lambda peer: peer not in suspect, departed=set(), failures=lambda peer: 0,
                             suspect_after=3, suspect=lambda peer: peer in suspect)
    sent = []

    def spawn(coro, what=""):
        sent.append(coro.cr_frame.f_locals["route"])   # where the microbatch is sent next
        coro.close()
    rec = Recovery("o", "r", SimpleNamespace(extra_skips=1), seat, ledger, SimpleNamespace(health=health),
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
