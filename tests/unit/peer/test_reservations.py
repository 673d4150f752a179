"""peer/pipeline/reservations.py: a later-listed forward never takes a slot the order counts on."""
from peer.pipeline.plan_view import Kind, TaskKey
from peer.pipeline.reservations import ForwardReservations

# order on this peer: F1, B1, F0, B0, F2 (microbatch 2 unlisted forward rank: after all)
PLANNED = {(1, "F"): 0.0, (1, "B"): 1.0, (0, "F"): 2.0, (0, "B"): 3.0, (2, "F"): 4.0}
F0, F1, F2 = (TaskKey(m, Kind.FORWARD, 1) for m in (0, 1, 2))
B1 = TaskKey(1, Kind.BACKWARD, 1)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_later_forward_waits_while_its_slot_is_reserved_for_an_earlier_one():
    r = ForwardReservations(PLANNED, clock=Clock())
    assert not r.allows(F0, stashed=0, limit=1)      # the one slot belongs to F1
    assert r.allows(F0, stashed=0, limit=2)          # room for both
    assert r.allows(F1, stashed=0, limit=1)
    assert r.allows(B1, stashed=5, limit=1)          # backwards free memory, never held back
    r.started(F1)
    assert not r.allows(F0, stashed=1, limit=1)      # plain memory limit
    assert r.allows(F0, stashed=0, limit=1)          # F1's backward freed its slot


def test_reservations_count_every_earlier_listed_forward():
    r = ForwardReservations(PLANNED, clock=Clock())
    assert r.reserved_before(F2) == 2
    assert not r.allows(F2, stashed=0, limit=2)
    r.started(F0)                                     # out of order, but it ran
    assert r.reserved_before(F2) == 1
    assert r.allows(F2, stashed=0, limit=2)


def test_a_forward_held_back_for_a_ghost_starts_after_the_patience():
    clock = Clock()
    r = ForwardReservations(PLANNED, patience_s=5.0, clock=clock)
    assert not r.allows(F0, stashed=0, limit=1)       # F1 may never come (rerouted)
    clock.now += 4.9
    assert not r.allows(F0, stashed=0, limit=1)
    clock.now += 0.2
    assert r.allows(F0, stashed=0, limit=1)
    assert not r.allows(F0, stashed=1, limit=1)       # but never over the memory limit
