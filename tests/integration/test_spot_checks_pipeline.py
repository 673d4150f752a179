"""Spot checks wired into the pipeline (issue 7), over the in-memory transport with the real
worker and handlers: a replica that sends wrong activations is reported by the peers it feeds
(a middle hop and an origin's head), one that returns wrong backward gradients by the peers it
returns them to (issue 24), its honest twin passes, and checking changes no result."""
import asyncio

import pytest
import torch

from protocol import messages as m

from coordinator.swarm_view import BanList
from peer.chaos import corrupting, parse_faults
from peer.security.spot_check_rules import SpotSampler
from bench.support.memory_swarm import batches_for, build_memory_swarm, make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=3, microbatch_samples=2, seq_len=8,
                 microbatches_per_origin=4, max_steps=3, learning_rate=1e-3, warmup_steps=1)
STAGE_OF = {"o": 0, "p": 1, "q": 1, "z": 2}
# p and q replicate stage 1; p feeds z (mb 0) and, on a reordered route, the origin's head (mb 2)
PATHS = {0: ["o", "p", "z"], 1: ["o", "q", "z"], 2: ["o", "z", "p"], 3: ["o", "q", "z"]}
SCHEDULE = make_schedule("t", STAGE_OF, PATHS)


def run(rate: float, cheat: str = "", wire: str = "auto"):
    async def scenario():
        batch, _ = batches_for(SPEC)
        _, workers = await build_memory_swarm(SPEC, SCHEDULE, batch, timeout=60, wire_compression=wire)
        records = {}
        for peer, w in workers.items():
            w.spot.sampler = SpotSampler(rate)
            w.spot.passes_every_s = 0.0             # every report published as it comes

            async def publish(record, peer=peer):
                records[peer] = record
            w.spot.publish = publish
        if cheat:
            workers["p"].seat.make_runner = corrupting(workers["p"].seat.make_runner, parse_faults(cheat))
        await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers.values())), 60)
        return workers, records
    return asyncio.run(scenario())


def initial_parameters() -> dict[str, torch.Tensor]:
    async def build():
        batch, _ = batches_for(SPEC)
        _, workers = await build_memory_swarm(SPEC, SCHEDULE, batch, timeout=60)
        return {peer: w.seat.make_runner(STAGE_OF[peer]).parameter_vector().clone() for peer, w in workers.items()}
    return asyncio.run(build())


def reports_of(records):
    return [(reporter, r) for reporter, rec in records.items() for r in rec.reports]


def test_a_replica_sending_wrong_activations_is_reported_and_banned():
    workers, records = run(1.0, cheat="corrupt@1:0.3")
    reports = reports_of(records)
    failed = [(who, r) for who, r in reports if not r.passed]
    assert failed and {r.suspect for _, r in failed} == {"p"}
    assert {who for who, _ in failed} == {"z", "o"}            # a middle hop and the origin's head
    assert all(r.iteration >= 1 and r.relative_error > 0.1 and r.stage == 1 for _, r in failed)
    # before the corruption starts, and for the honest twin, the recomputation agrees
    assert any(r.passed and r.suspect == "p" and r.iteration == 0 for _, r in reports)
    assert any(r.passed and r.suspect == "q" for _, r in reports)
    assert not any(r.suspect == "q" and not r.passed for _, r in reports)
    routes = {(SCHEDULE.epoch, r.microbatch_id): r for r in SCHEDULE.routes}
    bans = BanList(routes=lambda epoch, mb: routes.get((epoch, mb)))   # as the coordinator wires it
    for reporter, record in records.items():
        bans.observe(reporter, record.reports)
    assert set(bans.banned) == {"p"}
    assert bans.counts["failed"] == len(failed) and bans.ignored_reports == 0   # real reports all count
    # best effort, never in the way: every microbatch of every iteration still completed
    assert [o.completed for o in workers["o"].ledger.history] == [4, 4, 4]
    assert all(w.seat.runner.stashed == 0 for w in workers.values())


def test_an_honest_swarm_with_checks_on_reports_only_passes_and_trains_the_same():
    checked, records = run(1.0)
    reports = reports_of(records)
    assert len(reports) >= 6 and all(r.passed for _, r in reports), reports
    backward = [(who, r) for who, r in reports if r.kind == "backward"]
    assert {who for who, _ in backward} == {"o", "z"}             # p's and q's backwards were checked too
    assert {r.suspect for _, r in reports} == {"p", "q"}          # stage 1 is the only replicated one
    assert all(r.relative_error < 1e-5 for _, r in reports)       # fp32 replicas agree closely
    plain, none = run(0.0)
    assert none == {}
    # the returned-gradient size bound (on with checks off too) leaves no honest gradient out
    assert all(w.spot.stats["backward_left_out"] == 0 for w in {**checked, **plain}.values())
    # checking changes nothing the training computes, up to the order gradients add up in: on a
    # loaded machine that order differs, and Adam turns a rounding difference in a near-zero
    # gradient into a step of up to the learning rate, so compare the updates as a whole
    start = initial_parameters()
    for peer in STAGE_OF:
        with_checks = checked[peer].seat.runner.parameter_vector() - start[peer]
        without = plain[peer].seat.runner.parameter_vector() - start[peer]
        assert with_checks.norm() > 0, peer
        assert (with_checks - without).norm() <= 1e-3 * with_checks.norm(), peer
    assert [o.completed for o in checked["o"].ledger.history] == [4, 4, 4]
    assert [o.loss_sum for o in checked["o"].ledger.history] == \
        pytest.approx([o.loss_sum for o in plain["o"].ledger.history])


def test_a_replica_returning_wrong_backward_gradients_is_reported_and_banned():
    """Scaled by -100, its input gradients stall training while every forward check passes: the
    backward checks catch it, at both peers it returns gradients to (o on mb 0, z on mb 2)."""
    workers, records = run(1.0, cheat="badgrad@1:-100")
    reports = reports_of(records)
    failed = [(who, r) for who, r in reports if not r.passed]
    assert failed and {(r.suspect, r.kind) for _, r in failed} == {("p", "backward")}, failed
    assert {who for who, _ in failed} == {"o", "z"}
    assert all(r.iteration >= 1 and r.relative_error > 10 and r.stage == 1 for _, r in failed)
    assert any(r.passed and r.kind == "backward" and r.suspect == "p" and r.iteration == 0 for _, r in reports)
    assert all(r.passed for _, r in reports if r.kind == "forward" or r.suspect == "q")
    routes = {(SCHEDULE.epoch, r.microbatch_id): r for r in SCHEDULE.routes}
    bans = BanList(routes=lambda epoch, mb: routes.get((epoch, mb)))
    for reporter, record in records.items():
        bans.observe(reporter, record.reports)
    assert set(bans.banned) == {"p"} and bans.ignored_reports == 0
    assert [o.completed for o in workers["o"].ledger.history] == [4, 4, 4]


def test_with_checks_off_gradients_of_outlying_size_are_still_left_out_by_their_receivers():
    """The default (no spot checks): the size bound alone takes -100x gradients as zero, at both
    peers p returns them to, from the first one (iteration 1: its first wrong one), and nothing of q's."""
    workers, records = run(0.0, cheat="badgrad@1:-100")
    assert records == {}
    assert workers["o"].spot.bound.left_out == workers["z"].spot.bound.left_out == {"p": 2}
    assert [o.completed for o in workers["o"].ledger.history] == [4, 4, 4]
    from peer.app import PeerApp
    from peer.config import PeerConfig
    from peer.metrics import render_metrics
    app = PeerApp(PeerConfig(initial_peers=("/ip4/127.0.0.1/tcp/1/p2p/Qm",)))
    app.worker = workers["o"]
    assert "skippipe_peer_backward_gradients_left_out_total 2" in render_metrics(app)


def test_an_honest_swarm_passes_backward_checks_with_int8_on_the_wire():
    """Quantised gradients and activations (--wire-compression int8): the comparison allows half
    a quantisation step, so an honest replica is never reported, and a sign flip still is."""
    workers, records = run(1.0, wire="int8")
    assert sum(w.sender.wire.sent["int8"] for w in workers.values()) > 0
    reports = reports_of(records)
    assert any(r.kind == "backward" for _, r in reports)
    assert all(r.passed for _, r in reports), [r for _, r in reports if not r.passed]
    _, records = run(1.0, cheat="badgrad@1:-1", wire="int8")
    failed = [r for _, r in reports_of(records) if not r.passed]
    assert failed and {(r.suspect, r.kind) for r in failed} == {("p", "backward")}
