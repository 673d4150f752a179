"""coordinator/replanner.py: when to (re-)plan, with hysteresis against flapping peers."""
import pytest

from coordinator.replanner import PresenceTracker, ReplanPolicy

P = ReplanPolicy(min_peers=3, hold_s=2.0, min_gap_s=5.0)
ABC = frozenset("abc")
ABCD = frozenset("abcd")


def test_first_plan_needs_min_peers():
    t = PresenceTracker(P)
    t.observe(frozenset("ab"), 0.0)
    assert not t.should_plan(100.0)
    t.observe(ABC, 100.0)
    assert t.should_plan(102.0)


def test_first_plan_waits_for_each_peer_to_be_stable():
    t = PresenceTracker(ReplanPolicy(min_peers=1, hold_s=2.0, min_gap_s=5.0))   # no count to wait for
    t.observe(ABC, 10.0)
    assert not t.should_plan(10.0) and not t.should_plan(11.9)
    t.observe(ABCD, 11.0)                  # d's own hold starts; a, b, c keep theirs
    assert t.should_plan(12.0) and t.members == ABC
    assert not t.should_plan(12.9) or t.members == ABC
    t.should_plan(13.0)
    assert t.members == ABCD               # d counts once it has been online for hold_s


def test_with_min_peers_the_first_plan_goes_once_all_are_online():
    t = PresenceTracker(P)
    t.observe(frozenset("ab"), 0.0)
    assert not t.should_plan(0.5)
    t.observe(ABC, 50.0)                   # the third expected peer: no hold for the first plan
    assert t.should_plan(50.0)
    t.planned_now(50.0)
    assert t.planned == ABC
    for now in (50.5, 51.0, 52.0, 60.0):   # the hold passing later is no change, so no re-plan
        t.observe(ABC, now)
        assert not t.should_plan(now), now
    t.observe(frozenset("ab"), 70.0)       # after the first plan, a death is debounced as before
    assert not t.should_plan(71.0) and t.should_plan(72.0)


def test_first_plan_is_not_held_back_by_min_gap():
    t = PresenceTracker(ReplanPolicy(min_peers=1, hold_s=0.5, min_gap_s=1000.0))
    t.observe(ABC, 0.0)
    assert t.should_plan(0.5)


def test_no_replan_while_membership_matches_the_plan():
    t = PresenceTracker(P)
    t.observe(ABC, 0.0)
    t.planned_now(2.0)
    assert not t.should_plan(2.0) and not t.should_plan(1000.0)
    t.observe(ABC, 50.0)                   # the same set again is no change
    assert not t.should_plan(1000.0)


def test_replan_on_change_after_hold_and_min_gap():
    t = PresenceTracker(P)
    t.observe(ABC, 0.0)
    t.planned_now(2.0)
    t.observe(ABCD, 3.0)                   # a peer arrives
    assert not t.should_plan(4.0)          # hold not over
    assert not t.should_plan(6.9)          # hold over, min gap (5 s since 2.0) not
    assert t.should_plan(7.0)
    t.planned_now(7.0)
    assert not t.should_plan(7.0)
    t.observe(ABC, 100.0)                  # a peer dies long after: within hold_s
    assert not t.should_plan(101.0) and t.should_plan(102.0)


def test_replan_within_five_seconds_of_a_death():
    t = PresenceTracker(P)
    t.observe(ABCD, 0.0)
    t.planned_now(2.0)
    t.observe(ABC, 30.0)
    first = next(now / 10 for now in range(300, 400) if t.should_plan(now / 10))
    assert first - 30.0 <= 5.0


def test_min_peers_gates_only_the_first_plan():
    t = PresenceTracker(P)
    t.observe(frozenset("ab"), 0.0)
    assert not t.should_plan(100.0)        # not enough peers to start
    t.observe(ABC, 100.0)
    t.planned_now(103.0)
    t.observe(frozenset("ab"), 110.0)      # c died: re-plan without it, below min_peers
    assert not t.should_plan(110.5) and t.should_plan(112.0)
    t.planned_now(112.0)
    t.observe(frozenset(), 120.0)          # nobody left: nothing to plan
    assert not t.should_plan(200.0)


def test_flapping_peer_causes_at_most_one_replan_per_min_gap():
    for period in (0.5, 1.0, 2.5, 3.0, 4.0, 7.0):   # faster and slower than hold_s / min_gap_s
        t = PresenceTracker(P)
        plans = []
        now, flap_at, up = 0.0, 0.0, True
        while now < 120.0:
            if now >= flap_at:
                up, flap_at = not up, flap_at + period
            t.observe(ABCD if up else ABC, now)
            if t.should_plan(now):
                t.planned_now(now)
                plans.append(now)
            now = round(now + 0.1, 1)
        if period > P.hold_s:
            assert plans, period
        gaps = [b - a for a, b in zip(plans, plans[1:])]
        assert all(g >= P.min_gap_s - 1e-9 for g in gaps), (period, plans)
        assert len(plans) <= 120.0 / P.min_gap_s + 1
        # after the peer stops flapping the plan catches up with the membership
        settle = now + P.min_gap_s + P.hold_s
        t.observe(ABCD, now)
        assert t.should_plan(settle) or t.planned == ABCD


def test_a_flapping_peer_does_not_starve_the_replan_after_a_death():
    members = frozenset("abcde")
    t = PresenceTracker(P)
    t.observe(members, 0.0)
    t.planned_now(2.0)
    plans, now = [], 2.0
    while now < 60.0:
        current = set(members)
        if now >= 20.0:
            current.discard("d")           # d dies for good at t=20
        if now >= 10.0 and int(now) % 2:   # e flaps with a 2 s period from t=10
            current.discard("e")
        t.observe(frozenset(current), now)
        if t.should_plan(now):
            t.planned_now(now)
            plans.append(now)
        now = round(now + 0.1, 1)
    assert any(20.0 <= p <= 25.0 for p in plans), plans


def test_a_read_that_lost_most_of_the_swarm_is_held_back_for_a_while():
    from coordinator.replanner import CollapseGuard
    guard = CollapseGuard(hold_s=10.0)
    four = frozenset("abcd")
    assert guard.accept(four, frozenset("abc"), 0.0)          # one left: believe it
    assert guard.accept(four, frozenset("ab"), 0.0)           # half: believe it
    assert not guard.accept(four, frozenset("a"), 1.0)        # most of them at once: a failed lookup
    assert not guard.accept(four, frozenset(), 5.0)
    assert guard.accept(four, frozenset(), 11.5)              # still so after hold_s: they really left
    assert not guard.accept(four, frozenset(), 12.0)          # a new collapse starts a new hold
    assert guard.accept(frozenset("a"), frozenset(), 0.0)     # a lone peer may leave


def test_a_slow_read_that_lost_anyone_is_held_back_too():
    from coordinator.replanner import CollapseGuard
    guard = CollapseGuard(hold_s=10.0, slow_read_s=2.5)
    four = frozenset("abcd")
    assert guard.accept(four, frozenset("abc"), 0.0, read_s=0.1)      # a fast read: believe it
    assert not guard.accept(four, frozenset("abc"), 1.0, read_s=6.0)  # the DHT stalled: a lapse, likely
    assert guard.accept(four, four, 2.0, read_s=6.0)                  # nobody lost: nothing to hold
    assert not guard.accept(four, frozenset("abc"), 3.0, read_s=6.0)  # a new hold
    assert guard.accept(four, frozenset("abc"), 13.5, read_s=6.0)     # still gone after hold_s: gone


def test_a_new_epoch_starts_after_the_swarm_even_after_a_slow_warm_up_iteration():
    from coordinator.replanner import EARLY_ITERATION_S, switch_iteration
    # seen in CI: iteration 0 took 3.4 s (warm-up), the next ones 0.5 s, reports lagged 2 s; the
    # mean rate gave start 4 while the swarm was already in iteration 5
    assert switch_iteration(0, [3.4], 2.0, 4.0) == 0 + 2 + 24          # (4 + 2) s at 0.25 s
    assert EARLY_ITERATION_S == 0.25
    assert switch_iteration(2, [3.4, 0.5, 0.5], 1.5, 4.0) == 2 + 2 + 11   # fastest measured: 0.5 s
    assert switch_iteration(9, [2.0, 2.0, 2.0], 0.0, 4.0) == 9 + 2 + 2    # a slow swarm, measured
    assert switch_iteration(5, [0.001] * 3, 0.0, 1.0) == 5 + 2 + 20       # floor of 50 ms per iteration



def test_a_stalled_swarm_with_fresh_progress_records_gets_an_epoch_near_where_it_stands():
    from coordinator.replanner import switch_from_progress
    fast = [0.3, 0.3, 0.3]
    # the newest report is 30 s old (a peer stopped) but an origin re-stored its record 1 s ago:
    # before, the swarm was assumed to have gone on at 0.3 s an iteration (110 iterations on)
    assert switch_from_progress(66, fast, 30.0, 4.0, None, now=1000.0) == 66 + 2 + 114
    assert switch_from_progress(66, fast, 30.0, 4.0, (66, 999.0), now=1000.0) == 67 + 2 + 17
    # a stale record bounds nothing the old estimate does not; never before the next iteration but one
    assert switch_from_progress(66, fast, 30.0, 4.0, (66, 900.0), now=1000.0) == 66 + 2 + 114
    assert switch_from_progress(66, [], 0.0, 0.0, (10, 1000.0), now=1000.0) == 66 + 2
    # a peer's clock ahead of ours counts as a record written now, not in the future
    assert switch_from_progress(66, fast, 30.0, 4.0, (66, 1005.0), now=1000.0) == 67 + 2 + 14
    # the origin re-stored its record 29 s after it finished 66: iteration 67 has run 29 s so far,
    # so the swarm goes at least that slowly now, and the epoch starts 3 iterations on, not 17
    assert switch_from_progress(66, fast, 30.0, 4.0, (66, 999.0), now=1000.0, running_s=29.0) == 67 + 2 + 1


def test_a_crawling_swarm_gets_an_epoch_counted_at_its_pace_now():
    from coordinator.replanner import switch_iteration
    # a stopped peer still planned: 0.4 s iterations, then 6 s and 2 s ones; counted at the
    # fastest pace (0.4 s) the epoch started 10 iterations on, reached only after the peer was back
    assert switch_iteration(10, [0.4, 0.4, 0.4, 6.0, 2.0], 0.0, 4.0) == 10 + 2 + 1      # at (6 + 2) / 2 s
    assert switch_iteration(10, [0.4, 0.4, 0.4, 0.4, 0.4], 0.0, 4.0) == 10 + 2 + 10     # a steady swarm: as before
    assert switch_iteration(10, [0.4, 0.4, 0.4, 0.4, 1.2], 0.0, 4.0) == 10 + 2 + 5      # one slow iteration: 0.8 s
    assert switch_iteration(10, [0.4, 0.4, 0.4], 0.0, 4.0, running_s=5.0) == 10 + 2 + 1  # a stall in progress
    assert switch_iteration(0, [3.4], 0.0, 4.0, running_s=5.0) == 0 + 2 + 16             # unmeasured: fast, as before


def test_an_epoch_far_ahead_of_a_crawling_swarm_is_pulled_in_once_its_pace_shows():
    from coordinator.replanner import pulled_in_start
    # published from 87 with the swarm at 60 (counted at its fastest pace); it crawls
    assert pulled_in_start(87, 60, 63, published_s_ago=2.0, margin_s=4.0) is None   # too soon to tell
    assert pulled_in_start(87, 61, 63, published_s_ago=5.0, margin_s=4.0) == 63
    assert pulled_in_start(87, 80, 85, published_s_ago=5.0, margin_s=4.0) is None   # 2 sooner: not worth an epoch
    assert pulled_in_start(87, 86, 80, published_s_ago=9.0, margin_s=4.0) is None   # the swarm is about there
