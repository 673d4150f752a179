"""A replica cut off mid-iteration (a partition, not a kill) sits it out and rejoins (issue 9).
In-process swarm over the in-memory transport; the same worker code as live peers."""
import asyncio
import dataclasses

import pytest
import torch

from protocol import messages as m

from bench.support.memory_swarm import batches_for, build_memory_swarm, make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=3, microbatch_samples=2,
                 seq_len=16, microbatches_per_origin=2, max_steps=10, learning_rate=1e-3, warmup_steps=1)
STAGE_OF = {"o": 0, "a": 1, "b": 1, "z": 2}
PATHS = {0: ["o", "a", "z"], 1: ["o", "b", "z"]}
CUT_AT = 1


async def wait_until(predicate, timeout: float):
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def scenario(spec: m.RunSpec = SPEC):
    schedule = make_schedule("t", STAGE_OF, PATHS)
    batch, _ = batches_for(spec)
    network, workers = await build_memory_swarm(spec, schedule, batch, timeout=60)
    b = workers["b"]

    def cut_mid_forward(i: int, kind: str) -> None:     # what peer/isolation.py would conclude
        if i == CUT_AT and kind == "FORWARD" and not b.isolation.cut_off:
            network.cut.add("b")
            b.isolation.set(True, schedule.epoch)
    b.hooks.fault = cut_mid_forward
    runs = {p: asyncio.create_task(w.run()) for p, w in workers.items()}
    await wait_until(lambda: len(workers["o"].ledger.history) >= CUT_AT + 2, 60)
    assert b.isolation.cut_off
    network.cut.discard("b")                              # the heal; b is back but must rejoin first
    b.isolation.set(False, 0)
    start = workers["o"].ledger.iteration + 2                    # read and published with no await between
    assert start < SPEC.max_steps, "the swarm ran past the re-plan before the test could publish it"
    replan = dataclasses.replace(make_schedule("t", STAGE_OF, PATHS, epoch=2), start_iteration=start)
    for w in workers.values():
        w.book.add(replan)
    await asyncio.wait_for(asyncio.gather(*runs.values()), 90)
    return workers, start


@pytest.mark.parametrize("exchange", ["sync", "delayed"])
def test_a_cut_off_replica_is_routed_around_then_rejoins_with_the_replicas_state(exchange):
    # delayed updates: the replicas flush the update in flight before the re-plan's epoch, so
    # the state b copies has none pending (b was no replica of that iteration)
    workers, start = asyncio.run(scenario(dataclasses.replace(SPEC, gradient_exchange=exchange)))
    origin = workers["o"].ledger.history
    assert [o.iteration for o in origin] == list(range(SPEC.max_steps))
    for o in origin:                                      # every microbatch ended exactly once
        assert sum(o.counts.values()) == 2 and o.counts["lost"] == 0, (o.iteration, o.counts)
    assert origin[CUT_AT].counts["rerouted"] >= 1         # b's microbatch went through a instead
    b = workers["b"]
    # b abandoned the iteration it was cut off in and trained nothing until the re-plan
    assert [o.iteration for o in b.ledger.history] == list(range(CUT_AT)) + list(range(start, SPEC.max_steps))
    assert start < SPEC.max_steps
    assert not b.isolation.away
    # it took a's state when it rejoined, and the two have averaged identically since
    assert torch.equal(workers["a"].seat.runner.parameter_vector(), b.seat.runner.parameter_vector())
    # one update per iteration, the last one flushed at the run's end in delayed mode too
    assert workers["a"].seat.runner.step_count == b.seat.runner.step_count == SPEC.max_steps
