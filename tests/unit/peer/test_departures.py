"""Departures from DHT reads, and telling a collapsed view from real departures (issue 9)."""
import pytest

from protocol.adverts import PeerState
from peer.routing.departures import DepartureWatch, unreliable

ON, OFF = PeerState.ONLINE, PeerState.OFFLINE
SCHEDULED = ["me", "a", "b", "c"]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(grace=3.0):
    clock = Clock()
    return DepartureWatch("me", grace, clock), clock


def test_a_missing_advert_is_a_departure_only_after_the_grace_period():
    watch, clock = make()
    assert watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON}).departed == frozenset()
    clock.t = 2.0
    assert watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON}).departed == frozenset()
    clock.t = 3.5
    v = watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON})
    assert v.reliable and v.departed == {"c"} and v.missing == 1 and v.others == 3


def test_offline_is_believed_at_once_and_a_returning_peer_is_no_longer_departed():
    watch, clock = make()
    assert watch.observe(SCHEDULED, {"me": ON, "a": OFF, "b": ON, "c": ON}).departed == {"a"}
    clock.t = 10.0
    assert watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON, "c": ON}).departed == frozenset()


def test_a_read_that_lost_most_of_the_swarm_adds_no_departures():
    # the partition bug: a healthy peer whose lookup returned only itself declared everyone gone
    watch, clock = make()
    watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON, "c": ON})
    for t in (1.0, 5.0, 30.0):
        clock.t = t
        v = watch.observe(SCHEDULED, {"me": ON})
        assert not v.reliable and v.departed == frozenset() and v.missing == 3


def test_a_read_without_our_own_advert_or_no_record_at_all_is_unreliable():
    watch, clock = make()
    clock.t = 100.0
    assert not watch.observe(SCHEDULED, {"a": ON, "b": ON}).reliable
    assert not watch.observe(SCHEDULED, None).reliable
    assert watch.observe(SCHEDULED, None).departed == frozenset()


def test_decisions_from_sound_reads_survive_an_unreliable_one_and_goodbyes_still_count():
    watch, clock = make()
    watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON})
    clock.t = 4.0
    assert watch.observe(SCHEDULED, {"me": ON, "a": ON, "b": ON}).departed == {"c"}
    v = watch.observe(SCHEDULED, {"me": ON, "a": OFF})          # b and c missing: unreliable
    assert not v.reliable and v.departed == {"a", "c"}


def test_a_lone_other_peer_may_depart_and_the_rule_is_a_majority():
    assert not unreliable("me", {"a"}, ["me"])                  # 1 of 1 missing: it really left
    assert not unreliable("me", {"a", "b", "c", "d"}, ["me", "a", "b"])   # half missing
    assert unreliable("me", {"a", "b", "c", "d"}, ["me", "a"])           # more than half
    with pytest.raises(ValueError):
        DepartureWatch("me", 0.0)
