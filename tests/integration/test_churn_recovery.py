"""A peer dies mid-iteration: the others recover every microbatch, each counted exactly once
(issue 5). In-process swarm over the in-memory transport; the same worker code as live peers."""
import asyncio

import pytest
import torch

from protocol import messages as m

from peer.compute.model import get_config
from peer.compute.stages import reference_forward
from peer.chaos import make_hook, parse_faults
from bench.support.memory_swarm import batches_for, make_schedule, run_memory_swarm

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=3, microbatch_samples=2,
                 seq_len=16, microbatches_per_origin=2, max_steps=1, learning_rate=1e-3, warmup_steps=1)
SIX = {"a0": 0, "b0": 0, "a1": 1, "b1": 1, "a2": 2, "b2": 2}
SIX_PATHS = {0: ["a0", "a1", "a2"], 1: ["a0", "b1", "b2"], 2: ["b0", "a1", "b2"], 3: ["b0", "b1", "a2"]}


def run(schedule, spec=SPEC, kill=None):
    batch, cache = batches_for(spec)
    workers = asyncio.run(run_memory_swarm(spec, schedule, batch, timeout=60, kill=kill))
    return workers, cache


def counts(workers, origins):
    total: dict[str, int] = {}
    for o in origins:
        for k, v in workers[o].ledger.history[0].counts.items():
            total[k] = total.get(k, 0) + v
    return total


@pytest.mark.parametrize("when", ["FORWARD", "BACKWARD"])
def test_killed_middle_replica_every_stage_gets_each_microbatch_once(when):
    schedule = make_schedule("t", SIX, SIX_PATHS)
    reference, _ = run(schedule)
    workers, _ = run(schedule, kill={"a1": (0, when)})
    got = counts(workers, ["a0", "b0"])
    assert got["lost"] == 0 and got["rerouted"] >= 1
    assert sum(got.values()) == 4                       # every microbatch ended exactly once
    assert got["completed"] + got["rerouted"] == 4
    ref_loss = sum(reference[o].ledger.history[0].loss_sum for o in ("a0", "b0"))
    loss = sum(workers[o].ledger.history[0].loss_sum for o in ("a0", "b0"))
    assert abs(loss - ref_loss) < 1e-4                  # replayed losses equal the originals
    for peer in SIX:
        if peer == "a1":
            continue
        grad, samples = workers[peer].seat.runner.stepped_with
        ref_grad, ref_samples = reference[peer].seat.runner.stepped_with
        # the stage's gradient over all 4 microbatches: none lost, none counted twice
        assert samples == ref_samples == 8, peer
        assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=1e-4), peer
    assert torch.equal(workers["a2"].seat.runner.parameter_vector(), workers["b2"].seat.runner.parameter_vector())


def test_stage_without_replica_is_skipped_when_the_budget_allows():
    stage_of = {"o": 0, "p1": 1, "p2": 2, "p3": 3}
    spec = m.RunSpec(**{**SPEC.__dict__, "num_stages": 4, "skip_ratio": 0.25, "microbatches_per_origin": 2})
    paths = {0: ["o", "p1", "p2", "p3"], 1: ["o", "p2", "p3"]}
    workers, cache = run(make_schedule("t", stage_of, paths, skip_ratio=0.25), spec, kill={"p2": (0, "FORWARD")})
    got = workers["o"].ledger.history[0].counts
    assert got["lost"] == 0 and got["skipped_stage"] == 2
    expected = 0.0
    for local, order in enumerate([(0, 1, 3), (0, 3)]):  # stage 2 dropped from both routes
        tokens, targets = cache[(0, local, 0, 1)]
        expected += reference_forward(get_config("tiny"), spec.seed, tokens, targets, order, 4).item() * 2
    assert abs(workers["o"].ledger.history[0].loss_sum - expected) < 1e-4


def test_no_replica_and_no_skip_budget_reissues_on_a_fresh_route():
    stage_of = {"o": 0, "p1": 1, "p2": 2}
    spec = m.RunSpec(**{**SPEC.__dict__, "skip_ratio": 1 / 3})
    paths = {0: ["o", "p1"], 1: ["o", "p2"]}
    workers, cache = run(make_schedule("t", stage_of, paths, skip_ratio=1 / 3), spec, kill={"p1": (0, "FORWARD")})
    got = workers["o"].ledger.history[0].counts
    assert got == {"completed": 1, "rerouted": 0, "skipped_stage": 0, "reissued": 1, "lost": 0}
    tokens, targets = cache[(0, 0, 0, 1)]
    reissued = reference_forward(get_config("tiny"), spec.seed, tokens, targets, (0, 2), 3).item() * 2
    tokens, targets = cache[(0, 1, 0, 1)]
    planned = reference_forward(get_config("tiny"), spec.seed, tokens, targets, (0, 2), 3).item() * 2
    assert abs(workers["o"].ledger.history[0].loss_sum - (reissued + planned)) < 1e-4
    assert workers["p2"].seat.runner.stepped_with[1] == 4     # p2 counted both microbatches once


def test_unrecoverable_microbatches_are_reported_lost_and_the_iteration_ends():
    stage_of = {"o": 0, "p1": 1}
    spec = m.RunSpec(**{**SPEC.__dict__, "num_stages": 2})
    workers, _ = run(make_schedule("t", stage_of, {0: ["o", "p1"], 1: ["o", "p1"]}), spec,
                     kill={"p1": (0, "FORWARD")})
    outcome = workers["o"].ledger.history[0]
    assert outcome.counts["lost"] == 2 and outcome.completed == 0
    assert outcome.samples == 0 and outcome.loss_sum == 0.0   # nothing lost is counted
    assert not outcome.timed_out                              # detected, not waited out


def test_both_replicas_of_a_stage_killed_are_tried_at_most_twice_per_microbatch(caplog):
    """Stage 2's two replicas die together: a microbatch that cannot skip it is re-issued around
    it, one that can skips it, and neither bounces between the two dead replicas (each failed
    send made the other one the last resort again: 300 reroutes in 0.3 s, bench/faults.py).
    A suspect replica is tried once more as a last resort (a dropped relay connection is not a
    death: test_recovery_refusals.py), so a microbatch sees at most three reroutes."""
    stage_of = {"o": 0, "a1": 1, "a2": 2, "b2": 2}
    spec = m.RunSpec(**{**SPEC.__dict__, "skip_ratio": 1 / 3})
    paths = {0: ["o", "a2"], 1: ["o", "a1", "b2"]}
    with caplog.at_level("WARNING", logger="peer.pipeline.recovery"):
        workers, _ = run(make_schedule("t", stage_of, paths, skip_ratio=1 / 3), spec,
                         kill={"a2": (0, "FORWARD"), "b2": (0, "FORWARD")})
    got = workers["o"].ledger.history[0].counts
    assert got["lost"] == 0 and sum(got.values()) == 2, got
    reroutes = [r.getMessage() for r in caplog.records if ": rerouted: " in r.getMessage()]
    for mb in (0, 1):
        mine = [text for text in reroutes if f"microbatch {mb}:" in text]
        assert len(mine) <= 3, mine


def test_a_peer_that_takes_forwards_and_drops_them_is_routed_around_at_its_hop_deadline():
    # a1 answers every ping but drops the forwards it takes from iteration 2 on (a hung worker, a
    # volunteer that discards work): heartbeats cannot see it; the flights it holds pass their
    # hop deadline (measured in iterations 0-1, a low floor for the test) and go to b1
    spec = m.RunSpec(**{**SPEC.__dict__, "max_steps": 4})
    hang = make_hook(parse_faults("hang@2:600"), lambda factor: None)
    batch, _ = batches_for(spec)
    workers = asyncio.run(run_memory_swarm(spec, make_schedule("t", SIX, SIX_PATHS), batch, timeout=60,
                                           faults={"a1": hang}, hop_deadline_floor_s=0.2, hop_late_s=600))
    for i in range(4):
        got = counts_at(workers, ["a0", "b0"], i)
        assert got["lost"] == 0 and sum(got.values()) == 4, (i, got)
        assert got["rerouted"] == (2 if i >= 2 else 0), (i, got)   # paths 0 and 2 go through a1
    # a0 and b0 hand a1 its work: both marked it late, and only it
    assert {p for o in ("a0", "b0") for p in workers[o].recovery.health.late_peers()} == {"a1"}
    assert any("a1" in e and "missed its hop deadline" in e for e in workers["a0"].recovery.events)
    from peer.app import PeerApp
    from peer.config import PeerConfig
    from peer.metrics import render_metrics
    app = PeerApp(PeerConfig(initial_peers=("/ip4/127.0.0.1/tcp/1/p2p/Qm",)))
    app.worker = workers["a0"]
    text = render_metrics(app)
    misses = workers["a0"].recovery.deadline_misses
    assert misses >= 1 and f"skippipe_peer_hop_deadline_misses_total {misses}" in text
    assert "skippipe_peer_late_peers 1" in text


def counts_at(workers, origins, iteration):
    total: dict[str, int] = {}
    for o in origins:
        for k, v in workers[o].ledger.history[iteration].counts.items():
            total[k] = total.get(k, 0) + v
    return total
