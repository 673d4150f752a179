"""Spot checks over real processes and real P2P (issue 7): a replica of the middle stage that
sends wrong activations (`--fault corrupt@4`) and returns sign-flipped backward gradients
(`badgrad@4:-1`, issue 24) is caught by the peers it feeds and by those it returns gradients to,
banned by the coordinator and left out of the next schedule, with no microbatch lost. (An honest
swarm with every forward checked reports only passes: tests/swarm/test_shared_swarm.py; a
backward-only cheater is banned in tests/integration/test_spot_checks_pipeline.py.)"""
import asyncio

import pytest

from bench.support.harness import LOOPBACK, coordinator, planned_with, stop_processes, wait_for
from launcher.emulated_topology import make_identity
from launcher.processes import start_peer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def identities(tmp_path, n: int) -> list[str]:
    """Peer ids known before the peers start (the plan must be steered from the first round)."""
    return [make_identity(tmp_path / f"id{i}.key") for i in range(n)]


def start(app, tmp_path, stages: list[int], faults: dict[int, str]):
    procs = []
    for i, stage in enumerate(stages):
        key = tmp_path / f"id{i}.key"
        args = ["--initial-peers", *app.maddrs, "--run", app.config.run, "--device", "cpu",
                "--host-maddrs", *LOOPBACK, "--cache-dir", str(tmp_path / "cache"), "--no-benchmark",
                "--identity", str(key), "--stage", str(stage), "--spot-check-rate", "1"]
        if i in faults:
            args += ["--fault", faults[i]]
        procs.append(start_peer(args, tmp_path / f"peer{i}.log"))
    return procs


def assert_accounted(summaries, per_iteration: int):
    for s in summaries:
        assert s.completed + s.rerouted + s.skipped_stage + s.reissued == per_iteration and s.lost == 0, s


def test_a_peer_sending_wrong_activations_is_banned_and_planned_out(tmp_path):
    async def scenario():
        # stage 1 is replicated: the cheater (peer 1) and a twin the plan gives no work (slow), so
        # the cheater's outputs feed both stage 2 (peer 2) and, on reordered routes, the origins
        async with coordinator(num_stages=3, skip_ratio=0.0, min_peers=5, max_steps=1000) as app:
            ids = identities(tmp_path, 5)
            cheater, twin = ids[1], ids[4]
            app.adjust_topology = planned_with({twin})
            procs = start(app, tmp_path, [0, 1, 2, 0, 1], {1: "corrupt@4:0.3,badgrad@4:-1"})
            try:
                await wait_for(lambda: app.schedule is not None, 120, "the first plan")
                first = app.schedule
                feeds = {r.hops[j + 1].peer if j + 1 < len(r.hops) else r.origin
                         for r in first.routes for j, h in enumerate(r.hops) if h.peer == cheater}
                assert len(feeds) >= 2, f"the plan must have the cheater feed two peers: {first.routes}"
                # each peer publishes only its latest 64 reports, and the failures after iteration 2
                # can push the early passes out: collect what was published along the way
                seen = set()

                async def banned_collecting():
                    seen.update((who, r) for who, rec in (await app.records.get_spot_checks()).items()
                                for r in rec.reports)
                    return cheater in app.bans.banned
                await wait_for(banned_collecting, 120, "the cheater's ban", interval=1.0)
                await wait_for(lambda: app.schedule.epoch > first.epoch and cheater not in app.schedule.stage_of(),
                               60, "a schedule without the cheater")
                without = app.schedule          # (a later re-plan may follow it meanwhile)
                start_iteration = without.start_iteration
                await wait_for(lambda: app.summaries and app.summaries[-1].iteration >= start_iteration + 1,
                               180, "iterations of the new schedule")
                seen.update((who, r) for who, rec in (await app.records.get_spot_checks()).items()
                            for r in rec.reports)
                return ids, app.bans, app.status.status(), app.summaries, without, seen, first
            finally:
                stop_processes(procs)
    ids, bans, status, summaries, schedule, reports, first = asyncio.run(scenario())
    cheater, twin = ids[1], ids[4]
    assert set(bans.banned) == {cheater} and "spot checks" in bans.banned[cheater]
    failed = [(who, r) for who, r in reports if not r.passed]
    assert {r.suspect for _, r in failed} == {cheater} and len({who for who, _ in failed}) >= 2
    assert all(r.iteration >= 4 for _, r in failed)           # corrupt@4: iterations 0-3 were honest
    # the backward checks: the twin recomputed the cheater's backwards from the gradients the
    # next hops sent it, and the peers the cheater returned gradients to compared them
    backward = [(who, r) for who, r in reports if r.kind == "backward"]
    assert any(not r.passed for _, r in backward) and any(r.passed and r.iteration < 4 for _, r in backward)
    returned_to = {r.hops[j - 1].peer for r in first.routes for j in range(1, len(r.hops)) if r.hops[j].peer == cheater}
    assert {who for who, r in backward if not r.passed} <= returned_to and all(r.suspect == cheater for _, r in backward)
    assert bans.counts["passed"] >= 1                          # iterations 0-3 were checked and honest
    assert [p["peer_id"] for p in status["peers"] if p["state"] == "BANNED"] == [cheater]
    assert status["spot_checks"]["failed"] >= 2
    assert schedule.stage_of()[twin] == 1 and cheater not in schedule.stage_of()
    assert_accounted(summaries, per_iteration=4)               # training went on, nothing lost
    assert summaries[-1].iteration >= schedule.start_iteration + 1
    log = (tmp_path / "peer2.log").read_text() + (tmp_path / "peer0.log").read_text()
    assert "spot check FAILED" in log

