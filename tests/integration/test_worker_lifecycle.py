"""PipelineWorker's lifecycle (issue 22): shutdown() mid-run ends every worker's run() at once,
and no task the loops started (sends, spot checks, heartbeats, share deliveries) is left."""
import asyncio

from protocol import messages as m

from bench.support.memory_swarm import batches_for, build_memory_swarm, make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=5, microbatch_samples=2,
                 seq_len=16, microbatches_per_origin=2, max_steps=10_000, learning_rate=1e-3, warmup_steps=1)
STAGE_OF = {"o": 0, "a": 1, "b": 1, "z": 2}


async def scenario() -> set[asyncio.Task]:
    schedule = make_schedule("t", STAGE_OF, {0: ["o", "a", "z"], 1: ["o", "b", "z"]})
    batch, _ = batches_for(SPEC)
    _, workers = await build_memory_swarm(SPEC, schedule, batch, timeout=30)
    before = asyncio.all_tasks()
    runs = [asyncio.create_task(w.run()) for w in workers.values()]
    async with asyncio.timeout(60):
        while len(workers["o"].ledger.history) < 2:
            await asyncio.sleep(0.02)
    for w in workers.values():
        w.shutdown()
    async with asyncio.timeout(5):
        results = await asyncio.gather(*runs, return_exceptions=True)
    assert results == [None] * len(runs), results
    for _ in range(3):
        await asyncio.sleep(0)
    return asyncio.all_tasks() - before


def test_shutdown_ends_every_worker_and_leaves_no_task():
    assert asyncio.run(scenario()) == set()
