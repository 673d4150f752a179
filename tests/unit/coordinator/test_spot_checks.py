"""Spot checks: unpredictable sampling at the configured rate, tolerance comparison, the ban rule."""
import math

import pytest
import torch

from protocol import codec
from protocol.spot_checks import SpotCheckRecord, SpotCheckReport

from coordinator.swarm_view import BanList
from peer.security.spot_check_rules import SpotSampler, compare_outputs, report


def test_sampling_hits_the_rate_and_depends_on_the_secret():
    a, b = SpotSampler(0.1, b"a" * 32), SpotSampler(0.1, b"b" * 32)
    picks_a = {(i, mb) for i in range(200) for mb in range(10) if a.should_check(1, i, mb, 1)}
    picks_b = {(i, mb) for i in range(200) for mb in range(10) if b.should_check(1, i, mb, 1)}
    assert 140 < len(picks_a) < 260 and 140 < len(picks_b) < 260       # ~200 of 2000
    assert len(picks_a & picks_b) < 60                                  # another secret, other picks
    assert picks_a == {(i, mb) for i in range(200) for mb in range(10) if a.should_check(1, i, mb, 1)}
    assert not any(SpotSampler(0.0).should_check(1, i, 0, 0) for i in range(100))
    assert all(SpotSampler(1.0).should_check(1, i, 0, 0) for i in range(100))
    with pytest.raises(ValueError):
        SpotSampler(1.5)


def test_comparison_within_tolerance():
    ref = torch.randn(2, 8, 64)
    assert compare_outputs(ref + 1e-6 * torch.randn_like(ref), ref).passed
    wrong = compare_outputs(ref * 1.1, ref)
    assert not wrong.passed and wrong.relative_error == pytest.approx(0.1, rel=1e-3)
    assert not compare_outputs(ref[:1], ref).passed
    poisoned = ref.clone()
    poisoned[0, 0, 0] = float("nan")
    assert compare_outputs(poisoned, ref) .relative_error == math.inf


def failed(suspect, checker, iteration):
    return report(compare_outputs(torch.ones(3) * 2, torch.ones(3)), suspect, checker, 1, iteration, 0, 1)


def test_ban_needs_failures_from_distinct_reporters():
    bans = BanList(failures_to_ban=2, reporters_to_ban=2)
    assert bans.observe("c1", [failed("bad", "c1", 0), failed("bad", "c1", 1), failed("bad", "c1", 1)]) == []
    assert bans.observe("c1", [failed("honest", "c1", i) for i in range(10)]) == []   # one liar is not enough
    assert bans.observe("c2", [failed("bad", "c2", 2)]) == ["bad"]
    assert "bad" in bans.banned and "spot checks" in bans.banned["bad"]
    assert "honest" not in bans.banned


def test_reports_for_others_or_oneself_are_ignored():
    bans = BanList(failures_to_ban=1, reporters_to_ban=1)
    assert bans.observe("c1", [failed("x", "c2", 0)]) == []       # c1 relays a report it did not make
    assert bans.observe("x", [failed("x", "x", 0)]) == []          # nobody bans itself
    passed = report(compare_outputs(torch.ones(3), torch.ones(3)), "y", "c1", 1, 0, 0, 1)
    assert bans.observe("c1", [passed]) == [] and not bans.banned


def test_reports_travel_through_the_codec():
    record = SpotCheckRecord("c1", (failed("bad", "c1", 0),))
    assert codec.decode(codec.encode(record), expected=SpotCheckRecord) == record
    assert failed("bad", "c1", 0).relative_error == pytest.approx(1.0)
    inf_report = report(compare_outputs(torch.ones(2), torch.ones(3)), "s", "c", 0, 0, 0, 0)
    assert codec.decode(codec.encode(inf_report)) == inf_report
    with pytest.raises(Exception):
        SpotCheckReport("s", "c", 0, 0, 0, 0, -1.0, False)


def test_ban_list_counts_each_report_once():
    bans = BanList()
    ok = report(compare_outputs(torch.ones(3), torch.ones(3)), "y", "c1", 1, 0, 0, 1)
    for _ in range(3):   # a record is re-read every round: its reports must not be counted again
        bans.observe("c1", [ok, failed("bad", "c1", 0)])
        bans.observe("c2", [failed("bad", "c1", 1)])              # not c2's own report: ignored
    assert bans.counts == {"passed": 1, "failed": 1}


# ---- issue 24: reports count only from the checked hop's receiver on a published route ----

# stage of each peer; o is the origin (stage 0), p and q replicas of stage 1, z stage 2
STAGES = {"o": 0, "p": 1, "q": 1, "z": 2, "s1": 2, "s2": 2}
PATHS = {0: ["o", "p", "z"], 1: ["o", "q", "z"], 2: ["o", "p"]}      # mb 2: p's output goes back to o


def failed_at(suspect, checker, iteration, mb, epoch=3, stage=1):
    return report(compare_outputs(torch.ones(3) * 2, torch.ones(3)), suspect, checker, epoch, iteration, mb, stage)


def published_app():
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=3, skip_ratio=0.0))
    app._adopt(make_schedule("t", STAGES, PATHS, epoch=3))
    return app


def test_receivers_of_a_hop_are_the_next_hop_or_the_origin():
    from swarmcore.schedule_history import spot_check_receivers
    schedule = published_app().published.all[-1]
    route = {r.microbatch_id: r for r in schedule.routes}
    assert spot_check_receivers(route[0], "p", 1) == {"z"}
    assert spot_check_receivers(route[2], "p", 1) == {"o"}            # the last hop's output: the origin
    assert spot_check_receivers(route[0], "p", 2) == set()            # not p's stage on that route
    assert spot_check_receivers(route[0], "o", 0) == set()            # the origin's hop is never checked


def test_two_sybil_identities_cannot_ban_an_honest_peer():
    app = published_app()
    bans = app.bans                                   # the coordinator's, wired to its published routes
    assert bans.routes is not None
    for sybil in ("s1", "s2"):                        # members, but never p's receivers
        assert bans.observe(sybil, [failed_at("p", sybil, i, mb) for i in range(5) for mb in (0, 1, 2)]) == []
    assert bans.observe("o", [failed_at("p", "o", i, 0) for i in range(5)]) == []   # o sends to p on mb 0
    assert bans.observe("z", [failed_at("q", "z", i, 0) for i in range(5)]) == []   # q is not on mb 0
    assert bans.observe("z", [failed_at("p", "z", i, 0, epoch=99) for i in range(5)]) == []   # unpublished
    assert not bans.banned and bans.counts == {"passed": 0, "failed": 0} and bans.ignored_reports > 30


def test_reports_from_the_real_receivers_still_ban():
    bans = published_app().bans
    assert bans.observe("z", [failed_at("p", "z", 0, 0)]) == []
    assert bans.observe("o", [failed_at("p", "o", 1, 2)]) == ["p"]    # z on mb 0, the origin on mb 2
    assert "q" not in bans.banned and bans.counts["failed"] == 2


def share_report(suspect, reporter, iteration, stage=1, epoch=1):
    return SpotCheckReport(suspect, reporter, epoch, iteration, 0, stage, 1e3, False, kind="share")


def test_left_out_share_reports_ban_only_from_two_replicas_of_the_stage():
    # issue 24: a replica banned locally for poisoned shares is reported; the coordinator drops it
    # when two replicas of its stage (in a published epoch) report it, and never on others' word
    placed = {(1, 1): {"honest1", "honest2", "poisoner"}, (1, 0): {"sybil1", "sybil2"}}
    bans = BanList(routes=lambda epoch, mb: None, replicas=lambda epoch, stage: placed.get((epoch, stage), set()))
    assert bans.observe("honest1", [share_report("poisoner", "honest1", 3)]) == []    # one replica's word
    for sybil in ("sybil1", "sybil2"):                  # members not on stage 1 cannot ban a stage-1 replica
        assert bans.observe(sybil, [share_report("honest2", sybil, 3), share_report("honest2", sybil, 4)]) == []
    assert bans.observe("sybil1", [share_report("sybil2", "sybil1", 3, epoch=9)]) == []   # unpublished epoch
    assert bans.ignored_reports == 5
    assert bans.observe("honest2", [share_report("poisoner", "honest2", 3)]) == ["poisoner"]
    assert "share checks" in bans.banned["poisoner"] and "honest2" not in bans.banned
    assert codec.decode(codec.encode(share_report("a", "b", 1)), expected=SpotCheckReport).kind == "share"
    with pytest.raises(Exception, match="kind"):
        SpotCheckReport("a", "b", 1, 1, 0, 1, 1.0, False, kind="other")


def test_backward_reports_count_only_from_the_receiver_of_the_backward():
    # p's backward goes to the hop before it: o on mb 0 and mb 2; z (which sends p its gradient
    # on mb 0) and members off the route are not placed to check it
    from swarmcore.schedule_history import backward_check_receivers
    route = {r.microbatch_id: r for r in published_app().published.all[-1].routes}
    assert backward_check_receivers(route[0], "p", 1) == {"o"}
    assert backward_check_receivers(route[1], "z", 2) == {"q"}
    assert backward_check_receivers(route[0], "o", 0) == set()     # the origin's hop has no backward to check
    bans = published_app().bans

    def backward(suspect, reporter, iteration, mb, stage=1):
        return SpotCheckReport(suspect, reporter, 3, iteration, mb, stage, 100.0, False, kind="backward")
    assert bans.observe("z", [backward("p", "z", i, 0) for i in range(3)]) == []     # z only sends p gradients
    assert bans.observe("s1", [backward("p", "s1", i, 1) for i in range(3)]) == []
    assert bans.ignored_reports == 6
    assert bans.observe("o", [backward("p", "o", 0, 0)]) == []
    assert bans.observe("q", [backward("z", "q", 0, 1, stage=2)]) == []
    assert bans.observe("o", [backward("p", "o", 1, 2)]) == []                      # one reporter, twice
    assert not bans.banned and bans.counts["failed"] == 3


def test_a_stochastically_rounded_gradient_may_sit_a_whole_step_off_but_a_sign_flip_still_fails():
    from peer.compute.quantise import quantise
    ref = torch.randn(4096)
    _, _, rounded = quantise(ref, "int8", 64, torch.Generator().manual_seed(0))   # up to one step off
    _, _, nearest = quantise(ref, "int8", 64)                                     # up to half a step
    assert compare_outputs(nearest, ref, 1e-4, "int8", 64).passed
    assert compare_outputs(rounded, ref, 1e-4, "int8", 64, steps=1.0).passed
    assert not compare_outputs(rounded, ref, 1e-4, "int8", 64).passed   # half a step does not cover it
    assert not compare_outputs(-rounded, ref, 1e-4, "int8", 64, steps=1.0).passed


def test_min_max_int4_activations_pass_honestly_and_get_no_absmax_allowance_to_cheat_in():
    """Activations whose blocks share a sign: min/max int4's step is ~16x finer than absmax's, so
    an allowance of half an absmax step would hide a cheat of that size."""
    from peer.compute.quantise import quantise
    ref = torch.rand(4093) + 3.0                                # values in [3, 4]; an odd tail block
    _, _, sent = quantise(ref, "int4", 64, offsets=True)
    assert compare_outputs(sent, ref, 1e-4, "int4", 64, offsets=True).passed
    cheat = sent + 0.1                                          # within half an absmax step (4 / 7 / 2)
    assert compare_outputs(cheat, ref, 1e-4, "int4", 64).passed
    assert not compare_outputs(cheat, ref, 1e-4, "int4", 64, offsets=True).passed


def test_channel_blocks_are_judged_by_their_own_steps():
    """One channel far from the others: a token's row block spans it, so a row step is as coarse
    as that channel's distance; judged by its channel blocks, a cheat of that size is caught."""
    from peer.compute.quantise import quantise
    torch.manual_seed(0)
    ref = torch.randn(8, 64, 64) * 0.05
    ref[..., 0] += 8.0                                          # every row spans >= 8: half a step >= 0.26
    _, _, sent = quantise(ref, "int4", 64, offsets=True, channels=True)
    assert compare_outputs(sent, ref, 1e-4, "int4", 64, offsets=True, channels=True).passed
    cheat = sent.clone()
    cheat[..., 1:] += 0.2
    assert compare_outputs(cheat, ref, 1e-4, "int4", 64, offsets=True).passed   # what row steps would hide
    assert not compare_outputs(cheat, ref, 1e-4, "int4", 64, offsets=True, channels=True).passed
