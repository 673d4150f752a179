"""Spot checks: unpredictable sampling at the configured rate, tolerance comparison, the ban rule."""
import math

import pytest
import torch

from protocol import codec
from protocol.spot_checks import SpotCheckRecord, SpotCheckReport

from coordinator.swarm_view import BanList
from peer.security.spot_check import SpotSampler, compare_outputs, report


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
