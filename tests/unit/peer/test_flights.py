"""peer/pipeline/flights.py: attempt ordering and the per-iteration bookkeeping."""
import itertools

from hypothesis import given
from hypothesis import strategies as st

from peer.pipeline.flights import ATTEMPT_SLOTS, Flight, IterationState, OriginEntry, next_attempt
from peer.pipeline.plan_view import Kind
from protocol.schedule import Hop, Route

R = Route(3, (Hop(0, "o"), Hop(1, "a"), Hop(2, "b")))


# ---------------------------------------------------------------------------------------------
# next_attempt
# ---------------------------------------------------------------------------------------------
def test_first_replay_beats_the_original_send():
    for hop in range(5):
        assert next_attempt(0, hop) > 0


@given(st.integers(0, 10 * ATTEMPT_SLOTS), st.integers(0, 200), st.integers(0, 200))
def test_a_new_round_beats_any_attempt_of_an_older_round(current, hop, other_hop):
    nxt = next_attempt(current, hop)
    assert nxt > current
    # whatever any hop replayed in current's round, a replay built on it wins
    same_round = (current // ATTEMPT_SLOTS) * ATTEMPT_SLOTS + (other_hop % ATTEMPT_SLOTS)
    assert nxt > same_round
    assert next_attempt(nxt, hop) > nxt


@given(st.integers(0, 10 * ATTEMPT_SLOTS), st.integers(0, ATTEMPT_SLOTS - 2))
def test_within_a_round_upstream_beats_downstream(current, hop):
    assert next_attempt(current, hop) > next_attempt(current, hop + 1)
    # both land in the same (next) round
    assert next_attempt(current, hop) // ATTEMPT_SLOTS == next_attempt(current, hop + 1) // ATTEMPT_SLOTS


def test_equal_inputs_give_equal_attempts_and_far_hops_are_clamped():
    assert next_attempt(5, 2) == next_attempt(5, 2)
    assert next_attempt(0, ATTEMPT_SLOTS - 1) == next_attempt(0, 10 * ATTEMPT_SLOTS) == ATTEMPT_SLOTS
    assert next_attempt(0, 0) == 2 * ATTEMPT_SLOTS - 1


def test_attempts_of_a_round_stay_in_that_round():
    for current, hop in itertools.product([0, 63, 64, 500], range(ATTEMPT_SLOTS + 3)):
        assert next_attempt(current, hop) // ATTEMPT_SLOTS == current // ATTEMPT_SLOTS + 1


# ---------------------------------------------------------------------------------------------
# check_attempt / record_attempt
# ---------------------------------------------------------------------------------------------
def test_first_attempt_is_new_then_duplicate_then_stale():
    s = IterationState(iteration=0)
    assert s.check_attempt(3, Kind.FORWARD, 0) is None
    s.record_attempt(3, Kind.FORWARD, 0)
    assert s.check_attempt(3, Kind.FORWARD, 0) == "duplicate"
    s.record_attempt(3, Kind.FORWARD, 127)
    assert s.check_attempt(3, Kind.FORWARD, 0) == "stale"
    assert s.check_attempt(3, Kind.FORWARD, 127) == "duplicate"
    assert s.check_attempt(3, Kind.FORWARD, 128) is None


def test_record_attempt_never_goes_back():
    s = IterationState(iteration=0)
    s.record_attempt(3, Kind.FORWARD, 100)
    s.record_attempt(3, Kind.FORWARD, 5)
    assert s.seen[(3, Kind.FORWARD)] == 100
    assert s.check_attempt(3, Kind.FORWARD, 5) == "stale"


def test_attempts_are_per_microbatch_and_kind():
    s = IterationState(iteration=0)
    s.record_attempt(3, Kind.FORWARD, 64)
    assert s.check_attempt(3, Kind.BACKWARD, 0) is None
    assert s.check_attempt(4, Kind.FORWARD, 0) is None


# ---------------------------------------------------------------------------------------------
# expects_backward
# ---------------------------------------------------------------------------------------------
def test_expects_backward_reasons():
    s = IterationState(iteration=0)
    why = s.expects_backward(3, 0, "b")
    assert why is not None and "not waiting" in why
    s.flights[3] = Flight(R, hop_index=1, attempt=64, successor="b")
    assert s.expects_backward(3, 64, "b") is None
    why = s.expects_backward(3, 0, "b")
    assert why is not None and "superseded" in why and "64" in why
    why = s.expects_backward(3, 64, "x")
    assert why is not None and "does not owe" in why
    assert s.expects_backward(4, 64, "b") is not None


# ---------------------------------------------------------------------------------------------
# counts / unresolved
# ---------------------------------------------------------------------------------------------
def test_counts_and_unresolved():
    s = IterationState(iteration=2)
    outcomes = {0: "completed", 1: None, 2: "rerouted", 3: "completed", 4: "skipped_stage",
                5: "reissued", 6: None, 7: "lost"}
    for mb, out in outcomes.items():
        s.own[mb] = OriginEntry(planned=Route(mb, (Hop(0, "o"),)), outcome=out)
    assert s.unresolved() == [1, 6]
    assert s.counts() == {"completed": 2, "rerouted": 1, "skipped_stage": 1, "reissued": 1, "lost": 1}
    s.own[6].outcome = "lost"
    s.own[1].outcome = "completed"
    assert s.unresolved() == []
    assert sum(s.counts().values()) == len(outcomes)  # each microbatch counted exactly once


def test_counts_of_an_empty_iteration():
    s = IterationState(iteration=0)
    assert s.unresolved() == [] and set(s.counts().values()) == {0}
    assert set(s.counts()) == {"completed", "rerouted", "skipped_stage", "reissued", "lost"}
