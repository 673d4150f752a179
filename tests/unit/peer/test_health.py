"""peer/routing/health.py: bans with capped exponential backoff on a fake clock."""
import pytest

from peer.routing.health import Health


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(**kw):
    clock = Clock()
    return Health(clock=clock, **kw), clock


def test_backoff_doubles_and_is_capped():
    h, clock = make(base_ban_s=1.0, max_ban_s=5.0, suspect_after=100)
    seen = []
    for _ in range(6):
        h.record_failure("p", ["p", "q"])
        seen.append(h.ban_remaining("p"))
        clock.t += 10  # let the ban expire before the next failure
    assert seen == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_ban_expires_with_the_clock():
    h, clock = make(base_ban_s=2.0, suspect_after=100)
    h.record_failure("p", ["p", "q"])
    assert h.banned("p") and not h.usable("p")
    clock.t += 1.9
    assert h.banned("p") and h.ban_remaining("p") == pytest.approx(0.1)
    clock.t += 0.2
    assert not h.banned("p") and h.usable("p") and h.ban_remaining("p") == 0.0


def test_a_new_failure_never_shortens_a_ban():
    h, clock = make(base_ban_s=1.0, max_ban_s=30.0, suspect_after=100)
    for _ in range(4):                      # 1, 2, 4, 8: ends at t+8
        h.record_failure("p", ["p", "q"])
    assert h.ban_remaining("p") == pytest.approx(8.0)


def test_success_resets_failures_and_ban():
    h, clock = make(base_ban_s=1.0, suspect_after=3)
    for _ in range(3):
        h.record_failure("p", ["p", "q"])
    assert h.failures("p") == 3 and h.suspect("p") and h.banned("p")
    h.record_success("p")
    assert h.failures("p") == 0 and not h.banned("p") and not h.suspect("p") and h.usable("p")
    h.record_failure("p", ["p", "q"])       # the backoff starts over
    assert h.ban_remaining("p") == pytest.approx(1.0)


def test_suspect_threshold():
    h, clock = make(suspect_after=3)
    h.record_failure("p", ["p", "q"])
    h.record_failure("p", ["p", "q"])
    assert not h.suspect("p")
    h.record_failure("p", ["p", "q"])
    assert h.suspect("p")
    clock.t += 1e6                          # a suspect stays unusable after its ban ends
    assert not h.banned("p") and h.suspect("p") and not h.usable("p")


def test_departed_peers_are_suspect_until_they_announce_again():
    h, _ = make()
    h.set_departed(["p", "r"])
    assert h.suspect("p") and not h.usable("p") and not h.banned("p")
    assert h.usable("q")
    h.set_departed(["r"])                   # the set is replaced, not extended
    assert h.usable("p") and not h.usable("r")


def test_never_ban_the_last_usable_replica():
    h, _ = make(suspect_after=5)
    h.record_failure("p", ["p"])            # sole replica
    assert not h.banned("p") and h.usable("p") and h.failures("p") == 1


def test_never_ban_the_last_usable_replica_when_others_are_banned_or_departed():
    h, _ = make(suspect_after=5)
    h.record_failure("a", ["a", "b", "c"])   # b, c usable: a is banned
    assert h.banned("a")
    h.set_departed(["c"])
    h.record_failure("b", ["a", "b", "c"])   # a banned, c departed: b is the last one
    assert not h.banned("b") and h.usable("b")


def test_unknown_stage_still_bans():
    h, _ = make()
    h.record_failure("p")                    # replicas unknown (not in the schedule)
    assert h.banned("p")


def test_replicas_given_as_a_generator():
    h, _ = make(suspect_after=5)
    h.record_failure("p", (x for x in ["p", "q"]))
    assert h.banned("p")
    h.record_failure("q", (x for x in ["p", "q"]))   # p is banned now: q is the last one
    assert not h.banned("q")


def test_snapshot_lists_failing_peers():
    h, clock = make(base_ban_s=4.0)
    h.record_failure("p", ["p", "q"])
    h.record_success("q")
    assert h.snapshot() == {"p": {"failures": 1, "ban_s": 4.0}}


@pytest.mark.parametrize("kw", [dict(base_ban_s=0), dict(base_ban_s=-1), dict(base_ban_s=5, max_ban_s=4),
                                dict(suspect_after=0)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match="base_ban_s"):
        Health(**kw)


def test_forgetting_failures_makes_every_peer_usable_again():
    # a peer back from a partition: everyone failed it, through no fault of theirs
    h = Health(suspect_after=2)
    for _ in range(3):
        h.record_failure("a", ["a", "b"])
        h.record_failure("b", ["a", "b"])
    assert h.suspect("a") and h.suspect("b")
    h.forget_failures()
    assert h.usable("a") and h.usable("b") and h.failures("a") == 0 and h.snapshot() == {}


def test_a_silent_origin_looks_gone_only_while_someone_else_still_answers_us():
    """A stage-1 peer behind a relay that died heard from nobody: taking the silent origin for
    gone, it ended hundreds of empty iterations in seconds (tests/swarm/test_nat.py)."""
    now = [100.0]
    h = Health(clock=lambda: now[0])
    for _ in range(8):
        h.record_failure("origin")
    assert not h.looks_gone("origin", ["origin", "next"], after_failures=8, within_s=10)   # no witness
    h.record_success("next")
    assert h.looks_gone("origin", ["origin", "next"], after_failures=8, within_s=10)
    now[0] += 11                                        # the witness is stale again
    assert not h.looks_gone("origin", ["origin", "next"], after_failures=8, within_s=10)
    h.set_departed(["origin"])                          # its advert lapsed: gone, witness or not
    assert h.looks_gone("origin", [], after_failures=8, within_s=10)


def test_a_late_peer_gets_no_work_until_its_mark_lapses_although_it_answers_pings():
    h, clock = make()
    h.mark_late("p", 15.0)
    h.record_success("p")                     # a ping: it is alive, yet late
    assert h.late("p") and not h.usable("p") and not h.suspect("p")
    assert h.late_peers() == ("p",) and h.snapshot()["p"]["late_s"] == 15.0
    clock.t += 15.1
    assert not h.late("p") and h.usable("p") and h.late_peers() == ()
