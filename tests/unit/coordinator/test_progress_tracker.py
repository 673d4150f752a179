"""The coordinator's per-iteration summaries from the origins' bounded report windows."""
from protocol.messages import IterationReport, MicrobatchCounts, ProgressRecord

from coordinator.iteration_summaries import ProgressTracker


def report(peer: str, i: int, positions=(), lost=()) -> IterationReport:
    return IterationReport(peer, 1, i, loss_sum=2.0, samples=2, tokens=20, started_at=float(i),
                           finished_at=i + 0.5, counts=MicrobatchCounts(completed=1), positions=positions,
                           lost_microbatches=lost)


def records(window: range, peers=("a", "b")) -> dict:
    return {p: ProgressRecord(p, tuple(report(p, i, (10 * i + k, 1)) for i in window)) for k, p in enumerate(peers)}


def test_iterations_complete_in_order_with_their_positions_and_losses():
    t = ProgressTracker()
    recs = records(range(0, 3))
    recs["a"] = ProgressRecord("a", recs["a"].reports + (report("a", 3, lost=(7,)),))
    t.add(recs)
    done = t.complete(lambda i: {"a", "b"})
    assert [s.iteration for s in done] == [0, 1, 2]        # 3 waits for b
    assert done[1].positions == (10, 2) and done[1].lost_microbatches == ()
    t.add({"b": ProgressRecord("b", (report("b", 3),))})
    (s3,) = t.complete(lambda i: {"a", "b"})
    assert s3.lost_microbatches == (7,)


def test_a_window_that_moved_past_unread_iterations_does_not_stall_the_summaries():
    t = ProgressTracker()
    t.add(records(range(0, 4)))
    assert len(t.complete(lambda i: {"a", "b"})) == 4
    t.add(records(range(70, 134)))          # read too rarely: iterations 4..69 are gone everywhere
    done = t.complete(lambda i: {"a", "b"})
    assert t.missed == 66 and [s.iteration for s in done] == list(range(70, 134))


def test_a_restarted_coordinator_starts_at_the_first_iteration_its_schedule_covers():
    # the peers' windows hold iterations 178..209; the stored schedule (the only one a restarted
    # coordinator reads) starts at 200: iterations before it have no known origins
    t = ProgressTracker()
    t.add(records(range(178, 210)))
    origins = lambda i: {"a", "b"} if i >= 200 else set()     # noqa: E731
    done = t.complete(origins, known_from=200)
    assert [s.iteration for s in done] == list(range(200, 210))
    stuck = ProgressTracker()
    stuck.add(records(range(178, 210)))
    assert stuck.complete(origins) == [] and stuck.next_iteration == 178     # without it (the bug)


def test_the_freshest_dated_record_says_where_the_swarm_stood_and_when():
    t = ProgressTracker()
    assert t.freshest() is None
    recs = records(range(3, 6))
    t.add(recs)                                                  # undated (older peers): nothing
    assert t.freshest() is None
    t.add({"a": ProgressRecord("a", recs["a"].reports, written_at=50.0),
           "b": ProgressRecord("b", recs["b"].reports[:-1], written_at=40.0)})
    assert t.freshest() == (5, 50.0)
    t.add({"b": ProgressRecord("b", recs["b"].reports[:-1], written_at=60.0)})  # b re-stored, still at 4
    assert t.freshest() == (4, 60.0)
    # b finished 4 at 4.5 and, re-storing at 60, still had not finished 5: 5 has run 55.5 s so far
    assert t.running_s() == 55.5
    t.add({"a": ProgressRecord("a", recs["a"].reports, written_at=70.0)})
    assert t.running_s() == 70.0 - 5.5


def test_an_iteration_is_accounted_under_the_epoch_its_origins_ran_it_under():
    """Epoch 2 (origin a only) was published to start at iteration 3, but the origins read it too
    late and ran iteration 3 under epoch 1, where b was an origin too: b died meanwhile, so its
    epoch-1 microbatch of iteration 3 is lost, with epoch 1's sample positions."""
    import dataclasses
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0, microbatch_samples=2))
    first = make_schedule("t", {"a": 0, "b": 0, "m": 1}, {0: ["a", "m"], 1: ["b", "m"]}, epoch=1)
    app._adopt(first)
    app._adopt(dataclasses.replace(make_schedule("t", {"a": 0, "m": 1}, {0: ["a", "m"], 1: ["a", "m"]}, epoch=2),
                                   start_iteration=3, data_base=12))
    late = dataclasses.replace(report("a", 3), epoch=1)
    app.progress.add({"a": ProgressRecord("a", (late,))})
    assert app.published.origins_for(3) == {"a", "b"} and app.published.planned_ids(3, "b") == [1]
    summaries = app.progress.complete(app.published.origins_for, lambda p: p == "b", app.published.planned_microbatches,
                                      app.published.planned_ids)
    assert [s.lost_microbatches for s in summaries] == [(1,)]
    assert app.published.ran_under(3, {"a": late}) is first


def test_a_coordinator_that_missed_the_stored_schedule_follows_the_epoch_peers_report():
    import asyncio
    import dataclasses
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    stored = dataclasses.replace(make_schedule("t", {"a": 0, "m": 1}, {0: ["a", "m"]}, epoch=7), start_iteration=40)

    class Records:
        reads = 0

        async def get_schedule(self, previous=False):
            self.reads += 1
            return None if previous else stored
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0))
    app.records = Records()
    app._adopt(make_schedule("t", {"a": 0, "m": 1}, {0: ["a", "m"]}, epoch=1))   # planned from scratch
    app.progress.add({"a": ProgressRecord("a", (dataclasses.replace(report("a", 41), epoch=1),))})
    asyncio.run(app._follow_newer_epoch())
    assert app.schedule.epoch == 1 and app.records.reads == 0       # nothing newer reported: no read
    app.progress.add({"a": ProgressRecord("a", (dataclasses.replace(report("a", 42), epoch=7),))})
    asyncio.run(app._follow_newer_epoch())
    assert app.schedule is stored and app.published.origins_for(42) == {"a"}


def test_a_restarted_coordinator_accounts_the_iterations_before_a_stored_epoch_that_starts_ahead():
    """bench/faults.py: the coordinator published epoch 4 from iteration 138 and was restarted at
    130; knowing epoch 4 alone, iterations 130-137 went unsummarised. It reads the epoch before
    too, accounts them under it, and does not owe twice the losses epoch 4 already hands out."""
    import asyncio
    import dataclasses
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    from tokendata.cursor import microbatch_positions
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0, microbatch_samples=2))
    routes = make_schedule("t", {"a": 0, "b": 0, "m": 1}, {0: ["a", "m"], 1: ["b", "m"]}, epoch=3)
    before = dataclasses.replace(routes, start_iteration=71)
    lost_at_100 = microbatch_positions(before, 2, 100, 1)
    stored = dataclasses.replace(routes, epoch=4, start_iteration=138,
                                 data_base=before.data_base + 4 * 138, data_retry=tuple(lost_at_100))

    class Records:
        async def get_schedule(self, previous=False):
            return before if previous else stored
    app.records = Records()
    asyncio.run(app._adopt_stored(stored))
    assert app.schedule is stored and app.published.known_from() == 71
    app.progress.add(records(range(66, 134)))
    done = app.progress.complete(app.published.origins_for, known_from=app.published.known_from())
    assert [s.iteration for s in done] == list(range(71, 134))
    assert app.published.origins_for(130) == {"a", "b"}
    # iteration 100's loss, accounted again, is already epoch 4's to retrain; 130's is new
    assert app.ledger.lost(app.published.ran_under(100, {}), 100, [1]) == []
    assert app.ledger.lost(app.published.ran_under(130, {}), 130, [1]) == microbatch_positions(before, 2, 130, 1)
    assert app.ledger.pending == microbatch_positions(before, 2, 130, 1)


def test_the_schedule_stored_beside_a_new_one_is_the_one_the_swarm_runs():
    """Two re-plans a few seconds apart, both ahead of the swarm (epochs 6 from 138, then 7 from
    137, with the swarm at 128 under epoch 5): a restart must find epoch 5, not 6."""
    import dataclasses
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    from coordinator.iteration_summaries import summarize
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0))
    assert app._running_schedule() is None
    routes = make_schedule("t", {"a": 0, "m": 1}, {0: ["a", "m"]}, epoch=5)
    running = dataclasses.replace(routes, start_iteration=90)
    app._adopt(running)
    assert app._running_schedule() is running               # nothing summarised yet: the newest
    app._adopt(dataclasses.replace(routes, epoch=6, start_iteration=138))
    ran = dataclasses.replace(report("a", 128), epoch=5)
    app.summaries.append(summarize(128, [ran]))
    app.last_reports = {"a": ran}
    assert app._running_schedule() is running


def test_an_epoch_published_far_ahead_of_a_crawling_swarm_goes_out_again_from_nearer():
    """bench/faults.py, a 30 s stop: a re-plan decided while the DHT stalled started 27
    iterations ahead and the swarm crawled until then. Once the crawl shows, the coordinator
    publishes the same routes from nearer; the far epoch's retries move to the near one."""
    import asyncio
    import dataclasses
    import time
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    from coordinator.iteration_summaries import summarize
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0, microbatch_samples=2,
                                           switch_margin_s=4.0))
    stored, superseded = [], []

    class Records:
        async def put_schedule(self, schedule, previous=None, **kw):
            stored.append(schedule)
            superseded.append(kw.get("superseded"))
    app.records = Records()
    routes = make_schedule("t", {"a": 0, "m": 1}, {0: ["a", "m"]}, epoch=5)
    app._adopt(dataclasses.replace(routes, start_iteration=40))
    app.published.judge(40, {"a": dataclasses.replace(report("a", 40), epoch=5)})   # it took effect
    far = dataclasses.replace(routes, epoch=6, start_iteration=87, data_retry=(7, 8))
    app._adopt(far)
    now = time.time()
    for i in range(56, 61):   # the swarm at 60, 6 s an iteration now
        app.summaries.append(dataclasses.replace(summarize(i, [dataclasses.replace(report("a", i), epoch=5)]),
                                                 started_at=now - 6 * (61 - i), finished_at=now - 6 * (60 - i)))
    asyncio.run(app._pull_in_far_start())
    assert stored == []                                      # published just now: wait for the pace
    app._adopted_at -= 5.0
    asyncio.run(app._pull_in_far_start())
    assert len(stored) == 1 and app.schedule is stored[0]
    near = stored[0]
    assert near.epoch == 7 and near.routes == far.routes and 61 < near.start_iteration < 87 - 2
    assert set(far.data_retry) <= set(near.data_retry)       # the far epoch never runs: its retries move
    assert superseded == [far]          # stored too: a peer stopped meanwhile knows only the far one
    asyncio.run(app._pull_in_far_start())
    assert len(stored) == 1                                  # near enough now: once


def test_an_origin_missing_from_one_read_is_waited_for_and_one_that_stays_gone_lost_its_microbatches():
    """CI once counted a healthy origin's microbatches lost because one read of the adverts missed
    it (its store ran late under load); it reported the iteration a moment later."""
    import asyncio
    from bench.support.memory_swarm import make_schedule
    from coordinator.app import CoordinatorApp
    from coordinator.config import CoordinatorConfig
    app = CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0, microbatch_samples=2,
                                           lost_after_s=3.0))
    app._adopt(make_schedule("t", {"a": 0, "b": 0, "m": 1}, {0: ["a", "m"], 1: ["b", "m"]}, epoch=1))

    def tick(online: set[str], now: float, reports: dict) -> list:
        app.presence.observe(frozenset(online), now)
        app.progress.add({p: ProgressRecord(p, tuple(rs)) for p, rs in reports.items()})
        before = len(app.summaries)
        asyncio.run(app._account_iterations(frozenset(online), now))
        return app.summaries[before:]

    assert tick({"a", "b", "m"}, 0.0, {"a": [report("a", 0)]}) == []          # b has not reported yet
    assert tick({"a", "m"}, 1.0, {}) == []                                     # one read missed b
    done = tick({"a", "b", "m"}, 2.0, {"b": [report("b", 0)]})
    assert [(s.iteration, s.lost_microbatches) for s in done] == [(0, ())]
    assert tick({"a", "m"}, 3.0, {"a": [report("a", 0), report("a", 1)]}) == []   # b gone since 3.0
    assert tick({"a", "m"}, 5.9, {}) == []
    done = tick({"a", "m"}, 6.0, {})
    assert [(s.iteration, s.lost_microbatches) for s in done] == [(1, (1,))]
