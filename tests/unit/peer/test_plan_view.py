"""peer/pipeline/plan_view.py: what one schedule means for one peer."""
import pytest

from peer.pipeline import plan_view as pv
from peer.pipeline.plan_view import Destination, Kind, TaskKey
from protocol.schedule import (Hop, OrderEntry, PeerOrder, Phase, Route, Schedule,
                               StageAssignment)

F, B = Phase.FORWARD, Phase.BACKWARD


def r(mb, *hops):
    return Route(mb, tuple(Hop(s, p) for s, p in hops))


ROUTES = (
    r(0, (0, "o"), (1, "a"), (2, "b"), (3, "c")),
    r(1, (0, "o"), (2, "b")),                       # skips stages 1 and 3
    r(2, (0, "o2"), (1, "a2"), (3, "c")),
    r(3, (0, "o2"),),                               # stage 0 only
)
ORDER = (
    PeerOrder("o", (OrderEntry(0, F), OrderEntry(1, F), OrderEntry(0, F), OrderEntry(0, B),
                    OrderEntry(1, F), OrderEntry(1, B))),
    PeerOrder("b", (OrderEntry(0, F), OrderEntry(1, F), OrderEntry(1, B), OrderEntry(0, B))),
)
SCHEDULE = Schedule(
    run="pv-test", epoch=1, strategy="skippipe", num_stages=4, skip_ratio=0.25,
    assignment=tuple(StageAssignment(p, s) for p, s in
                     [("o", 0), ("o2", 0), ("a", 1), ("a2", 1), ("b", 2), ("c", 3)]),
    routes=ROUTES, order=ORDER)
PEERS = ["o", "o2", "a", "a2", "b", "c"]


def test_expected_tasks_of_an_origin():
    assert pv.expected_tasks(SCHEDULE, "o") == {
        TaskKey(0, Kind.ORIGIN_FORWARD, 0), TaskKey(0, Kind.HEAD, 4), TaskKey(0, Kind.ORIGIN_BACKWARD, 0),
        TaskKey(1, Kind.ORIGIN_FORWARD, 0), TaskKey(1, Kind.HEAD, 2), TaskKey(1, Kind.ORIGIN_BACKWARD, 0)}


def test_expected_tasks_of_a_middle_peer():
    assert pv.expected_tasks(SCHEDULE, "b") == {
        TaskKey(0, Kind.FORWARD, 2), TaskKey(0, Kind.BACKWARD, 2),
        TaskKey(1, Kind.FORWARD, 1), TaskKey(1, Kind.BACKWARD, 1)}
    assert pv.expected_tasks(SCHEDULE, "c") == {
        TaskKey(0, Kind.FORWARD, 3), TaskKey(0, Kind.BACKWARD, 3),
        TaskKey(2, Kind.FORWARD, 2), TaskKey(2, Kind.BACKWARD, 2)}
    assert pv.expected_tasks(SCHEDULE, "nobody") == set()


def test_stage0_only_route_is_all_at_the_origin():
    assert pv.expected_tasks(SCHEDULE, "o2") >= {
        TaskKey(3, Kind.ORIGIN_FORWARD, 0), TaskKey(3, Kind.HEAD, 1), TaskKey(3, Kind.ORIGIN_BACKWARD, 0)}
    route = ROUTES[3]
    assert pv.destination(route, TaskKey(3, Kind.ORIGIN_FORWARD, 0)) == Destination("o2", F, 1)
    assert pv.destination(route, TaskKey(3, Kind.HEAD, 1)) == Destination("o2", B, 0)
    assert pv.expected_sender(route, TaskKey(3, Kind.ORIGIN_BACKWARD, 0)) == "o2"


@pytest.mark.parametrize("route", ROUTES)
def test_walking_a_route_visits_exactly_the_expected_tasks(route):
    """Follow destination -> task_for_request from the origin's first forward to its backward:
    each hand-over comes from the task's expected sender, and the walk covers every expected
    task of every peer for this microbatch."""
    mb, n = route.microbatch_id, len(route.hops)
    peer, task = route.origin, TaskKey(mb, Kind.ORIGIN_FORWARD, 0)
    walked = {(peer, task)}
    for _ in range(2 * n + 2):
        dest = pv.destination(route, task)
        if dest is None:
            break
        nxt = pv.task_for_request(route, dest.peer, dest.phase, dest.hop_index)
        assert nxt is not None, (dest, task)
        assert pv.expected_sender(route, nxt) == peer
        peer, task = dest.peer, nxt
        walked.add((peer, task))
    assert task == TaskKey(mb, Kind.ORIGIN_BACKWARD, 0) and peer == route.origin
    expected = {(p, t) for p in PEERS for t in pv.expected_tasks(SCHEDULE, p) if t.microbatch_id == mb}
    assert walked == expected
    assert len(walked) == 2 * n + 1


def test_task_for_request_refuses_what_is_not_ours():
    route = ROUTES[0]
    assert pv.task_for_request(route, "a", F, 1) == TaskKey(0, Kind.FORWARD, 1)
    assert pv.task_for_request(route, "b", F, 1) is None          # hop 1 is a's
    assert pv.task_for_request(route, "o", F, 0) is None          # the origin's forward is never received
    assert pv.task_for_request(route, "o", F, 4) == TaskKey(0, Kind.HEAD, 4)
    assert pv.task_for_request(route, "c", F, 4) is None          # only the origin computes the head
    assert pv.task_for_request(route, "o", F, 5) is None
    assert pv.task_for_request(route, "o", B, 0) == TaskKey(0, Kind.ORIGIN_BACKWARD, 0)
    assert pv.task_for_request(route, "a", B, 0) is None
    assert pv.task_for_request(route, "c", B, 3) == TaskKey(0, Kind.BACKWARD, 3)
    assert pv.task_for_request(route, "o", B, 4) is None
    assert pv.task_for_request(route, "a", B, -1) is None


def test_destination_and_expected_sender_at_each_hop():
    route = ROUTES[0]
    assert pv.destination(route, TaskKey(0, Kind.ORIGIN_FORWARD, 0)) == Destination("a", F, 1)
    assert pv.destination(route, TaskKey(0, Kind.FORWARD, 3)) == Destination("o", F, 4)
    assert pv.destination(route, TaskKey(0, Kind.HEAD, 4)) == Destination("c", B, 3)
    assert pv.destination(route, TaskKey(0, Kind.BACKWARD, 1)) == Destination("o", B, 0)
    assert pv.destination(route, TaskKey(0, Kind.ORIGIN_BACKWARD, 0)) is None
    assert pv.expected_sender(route, TaskKey(0, Kind.FORWARD, 1)) == "o"
    assert pv.expected_sender(route, TaskKey(0, Kind.HEAD, 4)) == "c"
    assert pv.expected_sender(route, TaskKey(0, Kind.BACKWARD, 3)) == "o"     # from the head
    assert pv.expected_sender(route, TaskKey(0, Kind.BACKWARD, 2)) == "c"
    assert pv.expected_sender(route, TaskKey(0, Kind.ORIGIN_BACKWARD, 0)) == "a"


def test_priorities_second_forward_at_an_origin_is_the_head():
    assert pv.priorities(SCHEDULE, "o") == {(0, "F"): 0.0, (1, "F"): 1.0, (0, "H"): 2.0, (0, "B"): 3.0,
                                            (1, "H"): 4.0, (1, "B"): 5.0}
    assert pv.priorities(SCHEDULE, "b") == {(0, "F"): 0.0, (1, "F"): 1.0, (1, "B"): 2.0, (0, "B"): 3.0}
    assert pv.priorities(SCHEDULE, "c") == {}          # no order for c


def test_priority_of_follows_the_planned_order():
    planned = pv.priorities(SCHEDULE, "o")
    tasks = [TaskKey(1, Kind.ORIGIN_BACKWARD, 0), TaskKey(0, Kind.HEAD, 4), TaskKey(0, Kind.ORIGIN_FORWARD, 0),
             TaskKey(1, Kind.HEAD, 2), TaskKey(0, Kind.ORIGIN_BACKWARD, 0), TaskKey(1, Kind.ORIGIN_FORWARD, 0)]
    ordered = sorted(tasks, key=lambda t: pv.priority_of(t, planned))
    assert [(t.microbatch_id, t.kind) for t in ordered] == [
        (0, Kind.ORIGIN_FORWARD), (1, Kind.ORIGIN_FORWARD), (0, Kind.HEAD), (0, Kind.ORIGIN_BACKWARD),
        (1, Kind.HEAD), (1, Kind.ORIGIN_BACKWARD)]


def test_unlisted_head_runs_just_before_its_backward():
    planned = {(0, "F"): 0.0, (1, "F"): 1.0, (0, "B"): 2.0, (1, "B"): 3.0}
    head = pv.priority_of(TaskKey(1, Kind.HEAD, 3), planned)
    assert planned[(0, "B")] < head < planned[(1, "B")]


def test_unplanned_tasks_run_after_all_planned_ones_heads_first_the_rest_equal():
    planned = pv.priorities(SCHEDULE, "b")
    late = [TaskKey(9, Kind.FORWARD, 1), TaskKey(7, Kind.BACKWARD, 1), TaskKey(7, Kind.FORWARD, 1)]
    values = [pv.priority_of(t, planned) for t in late]
    assert min(values) > max(planned.values())
    # equal: the inbox breaks the tie by arrival, as the simulator runs a node without an order
    assert len(set(values)) == 1
    # a head with neither an H nor a B entry is unplanned too, but goes before the other unplanned
    head = pv.priority_of(TaskKey(42, Kind.HEAD, 2), planned)
    assert max(planned.values()) < head < min(values)


def test_replicas_origin_routes_and_data_shard():
    assert pv.replicas(SCHEDULE, 1) == ["a", "a2"]
    assert pv.replicas(SCHEDULE, 5) == []
    assert [x.microbatch_id for x in pv.origin_routes(SCHEDULE, "o2")] == [2, 3]
    assert pv.data_shard(SCHEDULE, "o") == (0, 2) and pv.data_shard(SCHEDULE, "o2") == (1, 2)
    assert [x.microbatch_id for x in pv.routes_through(SCHEDULE, "c")] == [0, 2]
