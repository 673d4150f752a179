"""Hop deadlines (peer/pipeline/hop_deadlines.py): measured per hop ahead, with a floor and a warm-up."""
import pytest

from peer.pipeline.hop_deadlines import DeadlinePolicy, HopDeadlines


def test_no_deadline_until_enough_flights_were_timed():
    d = HopDeadlines(DeadlinePolicy(floor_s=1.0, factor=3.0, min_samples=3))
    d.completed(0.6, 3)
    d.completed(0.4, 2)
    assert d.deadline_s(2) is None and not d.overdue(1.0, 2, now=1000.0)
    d.completed(0.1, 1)
    # slowest per hop: 0.2 s; per hop ahead: floor 1 + 3 x 0.2
    assert d.deadline_s(1) == pytest.approx(1.6)
    assert d.deadline_s(3) == pytest.approx(4.8)
    assert d.overdue(10.0, 1, now=11.7) and not d.overdue(10.0, 3, now=11.7)
    assert not d.overdue(0.0, 1, now=100.0)           # not sent yet: no clock running


def test_the_window_forgets_an_old_slow_flight():
    d = HopDeadlines(DeadlinePolicy(floor_s=0.5, factor=2.0, window=3, min_samples=1))
    d.completed(9.0, 1)
    assert d.deadline_s(1) == pytest.approx(18.5)
    for _ in range(3):
        d.completed(0.25, 1)
    assert d.deadline_s(1) == pytest.approx(1.0)
    assert "per hop ahead" in d.describe()


@pytest.mark.parametrize("kwargs", [{"floor_s": 0}, {"factor": 0.5}, {"window": 0}, {"min_samples": 5, "window": 4}])
def test_a_policy_that_could_never_or_always_fire_is_refused(kwargs):
    with pytest.raises(ValueError):
        DeadlinePolicy(**kwargs)
