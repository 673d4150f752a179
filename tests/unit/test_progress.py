"""coordinator/progress.py: per-iteration swarm summaries from stage-0 peers' reports."""
import math

import pytest

from coordinator.progress import ProgressTracker, summarize
from protocol.messages import IterationReport, MicrobatchCounts, ProgressRecord


def report(peer: str, it: int, *, loss_sum=2.0, samples=4, completed=4, lost=0, rerouted=0,
           epoch=1, start=10.0, end=11.0) -> IterationReport:
    return IterationReport(peer_id=peer, epoch=epoch, iteration=it, loss_sum=loss_sum, samples=samples,
                           tokens=samples * 8, started_at=start, finished_at=end,
                           counts=MicrobatchCounts(completed=completed, rerouted=rerouted, lost=lost),
                           stages_visited=completed * 3)


def records(*reports: IterationReport) -> dict[str, ProgressRecord]:
    by_peer: dict[str, list] = {}
    for r in reports:
        by_peer.setdefault(r.peer_id, []).append(r)
    return {p: ProgressRecord(p, tuple(rs)) for p, rs in by_peer.items()}


AB = lambda i: {"a", "b"}  # noqa: E731


def test_summarize_sums_and_averages():
    s = summarize(4, [report("a", 4, loss_sum=2.0, samples=4, start=1.0, end=3.0, epoch=1),
                      report("b", 4, loss_sum=6.0, samples=4, start=2.0, end=5.0, epoch=2, lost=1,
                             completed=2, rerouted=1)], unreported_lost=3)
    assert s.iteration == 4 and s.epoch == 2
    assert s.loss == 1.0 and s.samples == 8 and s.tokens == 64
    assert s.started_at == 1.0 and s.finished_at == 5.0 and s.duration_s == 4.0
    assert (s.completed, s.rerouted, s.lost) == (6, 1, 4)
    assert s.stages_visited == 18


def test_summarize_without_samples_is_nan_not_a_crash():
    s = summarize(0, [report("a", 0, samples=0, loss_sum=0.0)])
    assert math.isnan(s.loss)


def test_waits_for_every_expected_origin():
    t = ProgressTracker()
    t.add(records(report("a", 0)))
    assert t.complete(AB) == []
    t.add(records(report("b", 0)))
    done = t.complete(AB)
    assert [s.iteration for s in done] == [0] and done[0].samples == 8
    assert t.complete(AB) == []              # not summarized twice


def test_gone_origin_completes_the_iteration_and_its_microbatches_are_lost():
    t = ProgressTracker()
    t.add(records(report("a", 0, lost=1, completed=3)))
    assert t.complete(AB, gone=lambda p: False) == []
    done = t.complete(AB, gone=lambda p: p == "b", planned_for=lambda i, p: 5 if p == "b" else 99)
    assert len(done) == 1
    s = done[0]
    assert s.lost == 1 + 5 and s.completed == 3 and s.samples == 4


def test_a_gone_origin_that_did_report_is_counted_normally():
    t = ProgressTracker()
    t.add(records(report("a", 0), report("b", 0, lost=0)))
    s, = t.complete(AB, gone=lambda p: p == "b", planned_for=lambda i, p: 7)
    assert s.lost == 0 and s.completed == 8


def test_only_expected_origins_are_waited_for():
    t = ProgressTracker()
    t.add(records(report("a", 0)))
    s, = t.complete(lambda i: {"a"})
    assert s.samples == 4


def test_summaries_in_order_and_never_out_of_order():
    t = ProgressTracker()
    t.add(records(report("a", 0), report("b", 0), report("a", 1), report("a", 2), report("b", 2)))
    done = t.complete(AB)
    assert [s.iteration for s in done] == [0]          # iteration 1 still waits for b
    t.add(records(report("b", 1)))
    assert [s.iteration for s in t.complete(AB)] == [1, 2]
    assert t.next_iteration == 3


def test_no_expected_origins_means_not_complete():
    t = ProgressTracker()
    t.add(records(report("a", 0)))
    assert t.complete(lambda i: set()) == []


def test_resumption_starts_at_the_first_reported_iteration():
    t = ProgressTracker()
    t.add(records(report("a", 7), report("b", 7), report("a", 8)))
    done = t.complete(AB)
    assert [s.iteration for s in done] == [7] and t.started and t.next_iteration == 8
    # the start is fixed once: an older report arriving later is ignored
    t.add(records(report("a", 3), report("b", 3)))
    assert t.complete(AB) == [] and 3 not in t.reports


def test_late_reports_of_a_completed_iteration_are_ignored():
    t = ProgressTracker()
    t.add(records(report("a", 0), report("b", 0)))
    t.complete(AB)
    t.add(records(report("a", 0, loss_sum=100.0), report("a", 1), report("b", 1)))
    done = t.complete(AB)
    assert [s.iteration for s in done] == [1] and done[0].loss == 0.5


def test_records_repeat_old_reports_without_double_counting():
    t = ProgressTracker()
    t.add(records(report("a", 0), report("b", 0)))
    t.add(records(report("a", 0), report("b", 0)))    # the same record read twice
    s, = t.complete(AB)
    assert s.samples == 8 and s.completed == 8


def test_latest_reported():
    t = ProgressTracker()
    assert t.latest_reported() == -1
    t.add(records(report("a", 0), report("a", 1), report("b", 0)))
    assert t.latest_reported() == 1
    t.complete(AB)
    assert t.latest_reported() == 1


def test_resumption_when_origins_report_windows_are_misaligned():
    t = ProgressTracker()
    # a restarted coordinator reads each origin's bounded window of reports (16 in peer/app.py,
    # 5 here); b has already published 15, so its window no longer holds 10
    t.add(records(*[report("a", i) for i in range(10, 15)], *[report("b", i) for i in range(11, 16)]))
    t.complete(AB)
    t.add(records(*[report("a", i) for i in range(12, 17)], *[report("b", i) for i in range(12, 17)]))
    done = t.complete(AB)
    assert 16 in [s.iteration for s in done]
