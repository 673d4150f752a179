"""The mid-iteration recovery rules of peer/routing/fallback.py, alone (pure, no network)."""
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from peer.routing.fallback import (MAX_JUMP, Action, Budget, budget_for, check_route, classify,
                                   fresh_route, jumps_ok, recover_hop)
from protocol.schedule import Hop, Route


def swarm(replicas: dict[int, list[str]]):
    """stage -> peers, as the (stage_of, replicas_of) pair the rules take."""
    stage_of = {p: s for s, peers in replicas.items() for p in peers}
    return stage_of, (lambda s: list(replicas.get(s, [])))


def route(mb: int, *hops: tuple[int, str]) -> Route:
    return Route(mb, tuple(Hop(s, p) for s, p in hops))


def all_usable(_peer: str) -> bool:
    return True


def usable_except(*dead: str):
    return lambda p: p not in dead


# 4 stages, stage 1 and 2 replicated, stage 3 alone.
REPLICAS = {0: ["o"], 1: ["a1", "a2", "a3"], 2: ["b1", "b2"], 3: ["c1"]}
STAGE_OF, REPLICAS_OF = swarm(REPLICAS)
PLANNED = route(7, (0, "o"), (1, "a1"), (2, "b1"), (3, "c1"))


# ---------------------------------------------------------------------------------------------
# budget_for
# ---------------------------------------------------------------------------------------------
def test_budget_k0_never_allows_a_skip():
    assert budget_for(PLANNED, 4, skip_ratio=0.0).min_visits == 4
    assert budget_for(PLANNED, 4, skip_ratio=0.0, extra_skips=3).min_visits == 4


def test_budget_k_positive_allows_extra_skips():
    assert budget_for(PLANNED, 4, skip_ratio=0.25).min_visits == 3
    assert budget_for(PLANNED, 4, skip_ratio=0.25, extra_skips=2).min_visits == 2


def test_budget_never_below_two_stages_when_the_model_has_several():
    assert budget_for(PLANNED, 4, skip_ratio=0.5, extra_skips=10).min_visits == 2
    two = route(0, (0, "o"), (3, "c1"))
    assert budget_for(two, 4, skip_ratio=0.5).min_visits == 2


def test_budget_single_stage_model():
    alone = route(0, (0, "o"))
    assert budget_for(alone, 1, skip_ratio=0.0).min_visits == 1
    assert budget_for(alone, 1, skip_ratio=0.5).min_visits == 1


def test_budget_default_jump_is_the_skippipe_bound():
    assert budget_for(PLANNED, 4, 0.25).max_jump == MAX_JUMP


def test_jumps_ok_is_relative_to_the_frontier():
    assert jumps_ok([0, 2, 4], 2)
    assert not jumps_ok([0, 3], 2)
    assert jumps_ok([0, 2, 1, 4], 2)        # going back down keeps the frontier at 2
    assert not jumps_ok([0, 2, 1, 5], 2)


# ---------------------------------------------------------------------------------------------
# recover_hop: preference order
# ---------------------------------------------------------------------------------------------
def test_reroute_to_another_usable_replica_of_the_same_stage():
    d = recover_hop(PLANNED, 1, REPLICAS_OF, usable_except("a1"), Budget(min_visits=3))
    assert d.action == Action.REROUTE
    assert d.route.stages == PLANNED.stages
    new = d.route.hops[1].peer
    assert new in ("a2", "a3")
    assert d.route.hops[:1] + d.route.hops[2:] == PLANNED.hops[:1] + PLANNED.hops[2:]


def test_reroute_never_picks_the_failed_peer_even_if_it_looks_usable():
    # the caller says hop 1 failed; health may not have caught up yet
    for mb in range(10):
        r = route(mb, (0, "o"), (1, "a1"), (2, "b1"))
        d = recover_hop(r, 1, REPLICAS_OF, all_usable, Budget(min_visits=3))
        assert d.action == Action.REROUTE and d.route.hops[1].peer != "a1"


def test_reroute_skips_unusable_replicas():
    d = recover_hop(PLANNED, 1, REPLICAS_OF, usable_except("a1", "a2"), Budget(min_visits=4))
    assert d.action == Action.REROUTE and d.route.hops[1].peer == "a3"


def test_reroute_spreads_microbatches_over_replicas():
    picked = set()
    for mb in range(6):
        r = route(mb, (0, "o"), (1, "a1"), (2, "b1"))
        d = recover_hop(r, 1, REPLICAS_OF, usable_except("a1"), Budget(min_visits=3))
        assert d.route.microbatch_id == mb
        picked.add(d.route.hops[1].peer)
    assert picked == {"a2", "a3"}


def test_reroute_is_deterministic():
    a = recover_hop(PLANNED, 1, REPLICAS_OF, usable_except("a1"), Budget(min_visits=3))
    b = recover_hop(PLANNED, 1, lambda s: list(reversed(REPLICAS[s])), usable_except("a1"),
                    Budget(min_visits=3))
    assert a == b  # independent of the order the replicas come in


def test_reroute_preferred_over_skip_even_when_skip_is_allowed():
    d = recover_hop(PLANNED, 2, REPLICAS_OF, usable_except("b1"), Budget(min_visits=2))
    assert d.action == Action.REROUTE and d.route.hops[2].peer == "b2"


def test_skip_when_no_replica_and_budget_allows():
    d = recover_hop(PLANNED, 3, REPLICAS_OF, usable_except("c1"), Budget(min_visits=3))
    assert d.action == Action.SKIP
    assert d.route.stages == (0, 1, 2)
    assert d.route.microbatch_id == PLANNED.microbatch_id


def test_skip_middle_stage_keeps_the_rest_in_order():
    d = recover_hop(PLANNED, 2, REPLICAS_OF, usable_except("b1", "b2"), Budget(min_visits=3))
    assert d.action == Action.SKIP
    assert d.route.hops == (Hop(0, "o"), Hop(1, "a1"), Hop(3, "c1"))


def test_k0_never_skips():
    budget = budget_for(PLANNED, 4, skip_ratio=0.0)
    d = recover_hop(PLANNED, 3, REPLICAS_OF, usable_except("c1"), budget)
    assert d.action == Action.REISSUE and d.route is None


def test_skip_never_below_two_stages():
    short = route(1, (0, "o"), (3, "c1"))
    budget = budget_for(short, 4, skip_ratio=0.5, extra_skips=5)
    d = recover_hop(short, 1, REPLICAS_OF, usable_except("c1"), budget)
    assert d.action == Action.REISSUE


def test_skip_refused_when_it_would_break_the_bounded_jump():
    r = route(2, (0, "o"), (2, "b1"), (4, "d1"))          # 0 -> 2 -> 4, max jump 2
    rep = {0: ["o"], 2: ["b1"], 4: ["d1"]}
    _, rof = swarm(rep)
    d = recover_hop(r, 1, rof, usable_except("b1"), Budget(min_visits=2, max_jump=2))
    assert d.action == Action.REISSUE                     # 0 -> 4 jumps too far
    assert "skip budget" in d.detail
    d = recover_hop(r, 1, rof, usable_except("b1"), Budget(min_visits=2, max_jump=4))
    assert d.action == Action.SKIP and d.route.stages == (0, 4)


def test_second_skip_on_a_recovered_route_is_refused():
    budget = budget_for(PLANNED, 4, skip_ratio=0.25)    # one extra skip
    first = recover_hop(PLANNED, 3, REPLICAS_OF, usable_except("c1"), budget)
    assert first.action == Action.SKIP
    second = recover_hop(first.route, 2, REPLICAS_OF, usable_except("c1", "b1", "b2"), budget)
    assert second.action == Action.REISSUE


@pytest.mark.parametrize("hop", [0, -1, 4, 10])
def test_recover_hop_rejects_a_hop_outside_the_route(hop):
    with pytest.raises(ValueError, match="not a recoverable hop"):
        recover_hop(PLANNED, hop, REPLICAS_OF, all_usable, Budget(min_visits=2))


# ---------------------------------------------------------------------------------------------
# fresh_route
# ---------------------------------------------------------------------------------------------
def test_fresh_route_everyone_alive_keeps_the_planned_stages():
    r = fresh_route(PLANNED, 4, REPLICAS_OF, all_usable, budget_for(PLANNED, 4, 0.25))
    assert r.stages == PLANNED.stages
    assert r.hops[0] == PLANNED.hops[0] and r.microbatch_id == PLANNED.microbatch_id


def test_fresh_route_replaces_a_dead_peer_by_a_live_replica():
    r = fresh_route(PLANNED, 4, REPLICAS_OF, usable_except("b1"), budget_for(PLANNED, 4, 0.0))
    assert r.stages == PLANNED.stages and r.hops[2].peer == "b2"


def test_fresh_route_tops_up_with_other_stages():
    rep = {0: ["o"], 1: ["a"], 2: ["b"], 3: ["c"], 4: ["d"]}
    stage_of, rof = swarm(rep)
    planned = route(3, (0, "o"), (2, "b"), (4, "d"))
    budget = budget_for(planned, 5, 0.4)
    r = fresh_route(planned, 5, rof, usable_except("b"), budget)
    assert r is not None and len(r.hops) == len(planned.hops)
    assert 4 in r.stages and 2 not in r.stages          # kept what it could
    assert check_route(r, planned, stage_of, budget) is None


def test_fresh_route_does_not_exceed_the_planned_length():
    rep = {s: [f"p{s}"] for s in range(6)}
    _, rof = swarm(rep)
    planned = route(0, (0, "p0"), (1, "p1"), (3, "p3"))
    r = fresh_route(planned, 6, rof, all_usable, Budget(min_visits=2))
    assert r.stages == (0, 1, 3)


def test_fresh_route_shorter_than_planned_when_budget_allows():
    planned = PLANNED
    r = fresh_route(planned, 4, REPLICAS_OF, usable_except("c1"), budget_for(planned, 4, 0.25))
    assert r is not None and r.stages == (0, 1, 2)


def test_fresh_route_none_when_k0_and_a_stage_is_gone():
    assert fresh_route(PLANNED, 4, REPLICAS_OF, usable_except("c1"), budget_for(PLANNED, 4, 0.0)) is None


def test_fresh_route_none_when_nothing_is_alive():
    dead = usable_except("a1", "a2", "a3", "b1", "b2", "c1")
    assert fresh_route(PLANNED, 4, REPLICAS_OF, dead, budget_for(PLANNED, 4, 0.5, extra_skips=9)) is None


def test_fresh_route_none_when_only_far_stages_are_alive():
    rep = {0: ["o"], 1: ["a"], 5: ["f"]}
    _, rof = swarm(rep)
    planned = route(0, (0, "o"), (1, "a"), (5, "f"))
    assert fresh_route(planned, 6, rof, usable_except("a"), Budget(min_visits=2, max_jump=4)) is None


def test_fresh_route_spreads_by_microbatch():
    peers = set()
    for mb in range(4):
        planned = route(mb, (0, "o"), (1, "a1"), (2, "b1"))
        peers.add(fresh_route(planned, 3, REPLICAS_OF, usable_except("a1"), Budget(min_visits=3)).hops[1].peer)
    assert peers == {"a2", "a3"}


def test_fresh_route_finds_a_route_when_the_greedy_top_up_breaks_the_jump():
    rep = {0: ["o"], 1: ["a"], 2: ["b"], 3: ["c"], 4: ["d"]}
    stage_of, rof = swarm(rep)
    planned = route(0, (0, "o"), (2, "b"), (4, "d"))     # valid with max_jump 2
    budget = Budget(min_visits=2, max_jump=2)
    assert check_route(route(0, (0, "o"), (1, "a"), (3, "c")), planned, stage_of, budget) is None
    r = fresh_route(planned, 5, rof, usable_except("b"), budget)
    assert r is not None
    assert check_route(r, planned, stage_of, budget) is None


# ---------------------------------------------------------------------------------------------
# check_route: each reason
# ---------------------------------------------------------------------------------------------
BUDGET = Budget(min_visits=3, max_jump=2)


def test_check_route_accepts_planned_and_rerouted():
    assert check_route(PLANNED, PLANNED, STAGE_OF, BUDGET) is None
    rerouted = route(7, (0, "o"), (1, "a2"), (2, "b2"), (3, "c1"))
    assert check_route(rerouted, PLANNED, STAGE_OF, BUDGET) is None


@pytest.mark.parametrize("bad, reason", [
    (route(8, (0, "o"), (1, "a1"), (2, "b1")), "origin"),                    # other microbatch
    (route(7, (0, "x"), (1, "a1"), (2, "b1")), "origin"),                    # other origin
    (route(7, (0, "o"), (1, "a1"), (0, "o"), (2, "b1")), "stage 0 must come first"),
    (route(7, (0, "o"), (1, "a1"), (1, "a2"), (2, "b1")), "visits a stage twice"),
    (route(7, (0, "o"), (1, "b1"), (2, "b2")), "does not host stage 1"),     # b1 hosts stage 2
    (route(7, (0, "o"), (1, "zz"), (2, "b1")), "does not host stage 1"),     # unknown peer
    (route(7, (0, "o"), (1, "a1")), "fewer than the minimum 3"),
    (route(7, (0, "o"), (3, "c1"), (1, "a1")), "jumps too far"),
])
def test_check_route_rejections(bad, reason):
    why = check_route(bad, PLANNED, STAGE_OF, BUDGET)
    assert why is not None and reason in why


# ---------------------------------------------------------------------------------------------
# classify
# ---------------------------------------------------------------------------------------------
def test_classify_each_outcome_once():
    rerouted = route(7, (0, "o"), (1, "a2"), (2, "b1"), (3, "c1"))
    skipped = route(7, (0, "o"), (1, "a1"), (2, "b1"))
    assert classify(PLANNED, PLANNED, reissued=False) == "completed"
    assert classify(PLANNED, rerouted, reissued=False) == "rerouted"
    assert classify(PLANNED, skipped, reissued=False) == "skipped_stage"
    assert classify(PLANNED, PLANNED, reissued=True) == "reissued"    # reissue wins over all
    assert classify(PLANNED, skipped, reissued=True) == "reissued"
    both = route(7, (0, "o"), (1, "a3"), (2, "b1"))                   # rerouted and skipped
    assert classify(PLANNED, both, reissued=False) == "skipped_stage"


# ---------------------------------------------------------------------------------------------
# property: whatever recovery returns is acceptable to the next hop's check_route
# ---------------------------------------------------------------------------------------------
@st.composite
def scenarios(draw):
    num_stages = draw(st.integers(2, 7))
    reps = {0: ["o"]}
    for s in range(1, num_stages):
        reps[s] = [f"s{s}r{i}" for i in range(draw(st.integers(1, 3)))]
    stages = draw(st.lists(st.integers(1, num_stages - 1), unique=True, min_size=1,
                           max_size=num_stages - 1))
    max_jump = draw(st.integers(1, MAX_JUMP))
    assume(jumps_ok([0, *stages], max_jump))
    mb = draw(st.integers(0, 50))
    hops = [(0, "o")] + [(s, draw(st.sampled_from(reps[s]))) for s in stages]
    planned = route(mb, *hops)
    skip_ratio = draw(st.sampled_from([0.0, 0.25, 0.5]))
    extra = draw(st.integers(0, 3))
    budget = budget_for(planned, num_stages, skip_ratio, extra)
    budget = Budget(budget.min_visits, max_jump)
    peers = [p for s in range(1, num_stages) for p in reps[s]]
    dead = set(draw(st.lists(st.sampled_from(peers), unique=True)))
    return num_stages, reps, planned, budget, dead


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(scenarios(), st.data())
def test_property_recovered_routes_pass_check_route(scenario, data):
    num_stages, reps, planned, budget, dead = scenario
    stage_of, rof = swarm(reps)
    usable = usable_except(*dead)
    assert check_route(planned, planned, stage_of, budget) is None
    current = planned
    for _ in range(3):  # chained recoveries of the same microbatch
        if len(current.hops) < 2:
            break
        hop = data.draw(st.integers(1, len(current.hops) - 1))
        d = recover_hop(current, hop, rof, usable, budget)
        if d.action == Action.REISSUE:
            assert d.route is None
            break
        assert d.action in (Action.REROUTE, Action.SKIP)
        assert check_route(d.route, planned, stage_of, budget) is None
        if d.action == Action.REROUTE:
            assert usable(d.route.hops[hop].peer) and d.route.stages == current.stages
        else:
            assert len(d.route.hops) == len(current.hops) - 1
        current = d.route
    fresh = fresh_route(planned, num_stages, rof, usable, budget)
    if fresh is not None:
        assert check_route(fresh, planned, stage_of, budget) is None
        assert all(usable(h.peer) for h in fresh.hops[1:])
        assert len(fresh.hops) <= len(planned.hops)
        kept = [h.stage for h in planned.hops[1:] if any(usable(p) for p in reps[h.stage])]
        spare = [s for s in range(1, num_stages)
                 if s not in kept and any(usable(p) for p in reps[s])]
        # every planned stage with a live peer is kept, unless no route of that length can
        # keep them all within the jump bound (length comes first: it is the skip budget)
        if can_keep_all(kept, spare, len(fresh.hops) - 1, budget.max_jump):
            assert set(kept) <= set(fresh.stages)


def can_keep_all(kept: list[int], spare: list[int], length: int, max_jump: int) -> bool:
    """Brute force: is there a route of `length` stages after 0 that holds every kept stage in
    its planned order plus spare stages, each spare stage placed anywhere, within the bound?"""
    if len(kept) > length:
        return False
    for extra in itertools.combinations(spare, length - len(kept)):
        for order in itertools.permutations(kept + list(extra)):
            if [s for s in order if s in kept] == kept and jumps_ok([0, *order], max_jump):
                return True
    return False
