"""Demotion by measured speed (coordinator/slow_peers.py): hysteresis, ratios to the median."""
from coordinator.slow_peers import SlowPeers, SlowPolicy, late_reports
from protocol.topology import Links, Node, Topology, TOPOLOGY_FORMAT, Workload

POLICY = SlowPolicy(demote_ratio=3.0, restore_ratio=1.5, hold_s=10.0)
FAST = {"a": 0.001, "b": 0.0011, "c": 0.0009}


def test_a_peer_far_slower_than_the_median_is_demoted_only_after_the_hold():
    slow = SlowPeers(POLICY)
    slow.observe({**FAST, "d": 0.008}, now=0.0)
    slow.observe({**FAST, "d": 0.008}, now=9.0)
    assert not slow.pending() and slow.factors == {}
    slow.observe({**FAST, "d": 0.008}, now=10.0)
    assert slow.pending() and 7 < slow.factors["d"] < 9


def test_a_blip_shorter_than_the_hold_demotes_nobody():
    slow = SlowPeers(POLICY)
    slow.observe({**FAST, "d": 0.008}, now=0.0)
    slow.observe({**FAST, "d": 0.001}, now=5.0)      # back to normal: the clock restarts
    slow.observe({**FAST, "d": 0.008}, now=12.0)
    assert slow.factors == {}
    slow.observe({**FAST, "d": 0.008}, now=22.0)
    assert "d" in slow.factors


def test_a_machine_wide_slowdown_demotes_nobody():
    slow = SlowPeers(POLICY)
    for t in (0.0, 20.0, 40.0):
        slow.observe({p: 10 * s for p, s in {**FAST, "d": 0.0012}.items()}, now=t)
    assert slow.factors == {} and not slow.pending()


def test_a_demoted_peer_returns_once_it_keeps_time_again_and_unmeasured_peers_are_not_judged():
    slow = SlowPeers(POLICY)
    for t in (0.0, 10.0):
        slow.observe({**FAST, "d": 0.008, "new": 0.0}, now=t)
    slow.apply(topology_of(["a", "b", "c", "d"]))
    assert not slow.pending()
    slow.observe({**FAST, "d": 0.002}, now=11.0)      # 2x: not yet back within 1.5x
    slow.observe({**FAST, "d": 0.002}, now=30.0)
    assert "d" in slow.factors and not slow.pending()
    slow.observe({**FAST, "d": 0.0012}, now=31.0)
    slow.observe({**FAST, "d": 0.0012}, now=41.0)
    assert "d" not in slow.factors and slow.pending()


def test_too_few_measured_peers_judge_nobody_and_a_departed_peer_is_forgotten():
    slow = SlowPeers(POLICY)
    for t in (0.0, 20.0):
        slow.observe({"a": 0.001, "d": 0.01}, now=t)
    assert slow.factors == {}
    for t in (30.0, 40.0):
        slow.observe({**FAST, "d": 0.01}, now=t)
    assert "d" in slow.factors
    slow.observe(FAST, now=41.0)
    assert slow.factors == {}


def test_the_plan_sees_a_demoted_peer_slower_by_its_ratio():
    slow = SlowPeers(POLICY)
    for t in (0.0, 10.0):
        slow.observe({**FAST, "d": 0.008}, now=t)
    topology = slow.apply(topology_of(["a", "b", "c", "d"]))
    by_id = {n.id: n for n in topology.nodes}
    assert by_id["a"].slowdown == 1.0 and 7 < by_id["d"].slowdown < 9
    assert slow.planned_with == {"d"} and "d" in slow.describe()


def topology_of(ids):
    n = len(ids)
    lat = tuple(tuple(0.0 if i == j else 1.0 for j in range(n)) for i in range(n))
    w = Workload(num_layers=4, num_stages=2, microbatch_samples=4, microbatches_per_data_node=2,
                 activation_bytes_per_sample=1024, memory_microbatches=4)
    return Topology(TOPOLOGY_FORMAT, w, tuple(Node(i, 0.001) for i in ids), Links(lat, lat))


def test_a_peer_named_late_is_demoted_at_once_and_planned_again_after_the_memory_and_hold():
    slow = SlowPeers(SlowPolicy(hold_s=5.0, late_factor=10.0, late_memory_s=20.0))
    slow.observe({**FAST, "d": 0.001}, now=0.0, late={"d"})
    assert slow.pending() and slow.factors == {"d": 10.0} and "(late)" in slow.describe()
    slow.observe({**FAST, "d": 0.001}, now=15.0, late={"d"})      # named again: the memory restarts
    slow.observe({**FAST, "d": 0.001}, now=30.0)
    assert slow.factors == {"d": 10.0}                               # 15 s since: still remembered
    slow.observe({**FAST, "d": 0.001}, now=36.0)                     # forgotten; its speed is fine
    slow.observe({**FAST, "d": 0.001}, now=40.0)
    assert "d" in slow.factors                                       # ... for less than the hold
    slow.observe({**FAST, "d": 0.001}, now=41.5)
    assert slow.factors == {}
    slow.observe(FAST, now=42.0, late={"gone"})                      # not online: nobody to demote
    assert slow.factors == {}


def test_only_a_planned_neighbour_on_another_stage_can_name_a_peer_late():
    from types import SimpleNamespace as NS
    from protocol.schedule import Hop, Route, Schedule, StageAssignment
    schedule = Schedule("r", 1, "skippipe", 2, 0.0, tuple(StageAssignment(p, s) for p, s in
                                                          (("o", 0), ("a", 1), ("b", 1))),
                        (Route(0, (Hop(0, "o"), Hop(1, "a"))),))
    adverts = {"o": NS(late_peers=("a",)), "b": NS(late_peers=("a",)), "x": NS(late_peers=("o",)),
               "a": NS(late_peers=("ghost", "a"))}
    # o (stage 0) hands a its work; b is a's replica, x no member, a names itself and a stranger
    assert late_reports(adverts, schedule) == {"a"}
    assert late_reports({"b": NS(late_peers=("a",))}, schedule) == set()
    assert late_reports(adverts, None) == set()
