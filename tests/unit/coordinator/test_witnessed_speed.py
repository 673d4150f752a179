"""A peer's speed as the origins' round trips show it (coordinator/witnessed_speed.py), and a peer
that advertises a fast speed but computes slowly demoted by it (coordinator/slow_peers.py)."""
import random

from bench.support.memory_swarm import make_schedule
from coordinator.slow_peers import SlowPeers, SlowPolicy
from coordinator.witnessed_speed import WitnessedSpeed
from protocol.messages import IterationReport, MicrobatchCounts

# two origins, two replicas each of stages 1 and 2; with skips, routes through different subsets
STAGE_OF = {"o1": 0, "o2": 0, "a1": 1, "a2": 1, "b1": 2, "b2": 2}
SKIPPING = {0: ["o1", "a1", "b1"], 1: ["o1", "a1"], 2: ["o1", "b2"], 3: ["o1", "a2", "b2"],
            4: ["o2", "a2", "b1"], 5: ["o2", "b1"], 6: ["o2", "a2"], 7: ["o2", "a1", "b2"]}
TRUE = {"a1": 0.10, "a2": 0.12, "b1": 0.80, "b2": 0.11}        # b1 computes ~8x slower


def reports_for(schedule, noise: float, rng: random.Random, lie: dict | None = None) -> dict:
    out = {}
    for origin in ("o1", "o2"):
        timed, seconds = [], []
        for route in (r for r in schedule.routes if r.origin == origin):
            peers = [h.peer for h in route.hops[1:]]
            timed.append(route.microbatch_id)
            seconds.append(sum(TRUE[p] for p in peers) + rng.uniform(0, noise))
        out[origin] = IterationReport(origin, schedule.epoch, 0, 1.0, 2, 16, 0.0, 1.0, MicrobatchCounts(completed=4),
                                      timed_microbatches=tuple(timed), round_trip_s=tuple(seconds))
    return out


def witnessed_after(paths: dict, iterations: int = 4, noise: float = 0.02) -> dict[str, float]:
    schedule, rng, witness = make_schedule("t", STAGE_OF, paths), random.Random(0), WitnessedSpeed()
    for _ in range(iterations):
        witness.add(schedule, reports_for(schedule, noise, rng))
    return witness.times()


def test_skipping_routes_tell_every_peer_apart_and_show_the_slow_one():
    times = witnessed_after(SKIPPING)
    assert set(times) == set(TRUE)
    for peer, seconds in TRUE.items():
        assert abs(times[peer] - seconds) < 0.03, (peer, times)


def test_routes_that_each_visit_one_peer_identify_every_peer():
    """3 stages at skip 1/3 (bench/faults.py): every route visits its origin and one other peer."""
    one_each = {0: ["o1", "a1"], 1: ["o1", "a1"], 2: ["o1", "b1"], 3: ["o1", "a2"],
                4: ["o2", "b1"], 5: ["o2", "b2"], 6: ["o2", "b2"], 7: ["o2", "a2"]}
    times = witnessed_after(one_each)
    assert set(times) == set(TRUE) and times["b1"] > 5 * max(times["a1"], times["a2"], times["b2"])


def test_peers_that_always_travel_together_get_no_figure():
    together = {0: ["o1", "a1", "b1"], 1: ["o1", "a1", "b1"], 2: ["o1", "b2"], 3: ["o1", "a2", "b2"],
                4: ["o2", "a2", "b2"], 5: ["o2", "a1", "b1"], 6: ["o2", "a2"], 7: ["o2", "a2", "b2"]}
    times = witnessed_after(together)
    assert "a1" not in times and "b1" not in times      # a1 and b1 only ever appear together
    assert abs(times["a2"] - TRUE["a2"]) < 0.03 and abs(times["b2"] - TRUE["b2"]) < 0.03


def test_round_trips_an_origin_reports_for_microbatches_not_its_own_are_ignored():
    schedule, witness = make_schedule("t", STAGE_OF, SKIPPING), WitnessedSpeed()
    forged = IterationReport("o1", 1, 0, 1.0, 2, 16, 0.0, 1.0, MicrobatchCounts(completed=4),
                             timed_microbatches=(4, 5, 6, 7, 99), round_trip_s=(9.0,) * 5)   # o2's, and none
    witness.add(schedule, {"o1": forged})
    assert not witness.samples


def test_a_peer_that_advertises_fast_but_is_witnessed_slow_is_demoted_then_forgiven_when_unseen():
    """The advert says every peer is equally fast; the origins' round trips say b1 is ~7x
    slower than the median: demoted after the hold. Routed around, it is no longer witnessed;
    its figure is forgotten after witness_memory_s and it is planned as it advertises again."""
    slow = SlowPeers(SlowPolicy(hold_s=6.0, witness_memory_s=30.0))
    adverts = {p: 0.001 for p in STAGE_OF}
    times = witnessed_after(SKIPPING)
    slow.observe(adverts, 0.0, times)
    slow.observe(adverts, 5.0, times)
    assert slow.factors == {}
    slow.observe(adverts, 6.0, times)
    assert set(slow.factors) == {"b1"} and slow.factors["b1"] > 3 and "witnessed" in slow.describe()
    slow.observe(adverts, 20.0, {})                    # no longer on any route: its figure stays a while
    assert "b1" in slow.factors
    slow.observe(adverts, 40.0, {})
    slow.observe(adverts, 46.0, {})
    assert slow.factors == {}


def test_an_iteration_with_a_rerouted_microbatch_witnesses_nothing():
    """A stopped replica's work goes to the other one, which then looks slow: not its speed."""
    import dataclasses
    schedule, witness = make_schedule("t", STAGE_OF, SKIPPING), WitnessedSpeed()
    reports = reports_for(schedule, 0.0, random.Random(0))
    reports["o2"] = dataclasses.replace(reports["o2"], counts=MicrobatchCounts(completed=3, rerouted=1))
    witness.add(schedule, reports)
    assert not witness.samples


def test_witnessed_ratios_demote_from_2x_and_restore_only_at_the_median():
    """Demoted, a slow peer queues less and its witnessed ratio drops (2.9, then 1.4 for a 10x
    stall in tests/swarm/test_churn.py): planned at what it shows, restored only at the median."""
    slow = SlowPeers(SlowPolicy(hold_s=6.0))
    adverts = {p: 0.001 for p in ("a", "b", "c", "d")}

    def seen(d: float) -> dict:
        return {"a": 1.0, "b": 1.1, "c": 0.9, "d": d}
    for t in (0.0, 6.0):
        slow.observe(adverts, t, seen(1.9))
    assert slow.factors == {}
    for t in (10.0, 16.0):
        slow.observe(adverts, t, seen(2.5))
    assert 2.2 < slow.factors["d"] < 2.6
    for t in (20.0, 30.0):
        slow.observe(adverts, t, seen(1.4))
    assert 1.2 < slow.factors["d"] < 1.5            # still demoted, planned at what it shows
    for t in (40.0, 46.0):
        slow.observe(adverts, t, seen(0.95))
    assert slow.factors == {}
