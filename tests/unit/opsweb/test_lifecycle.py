"""opsweb/lifecycle.py: run() owns its spawned tasks in a TaskGroup; shutdown() ends them all;
a spawned task's crash is logged and the rest goes on; main's own exception comes out as itself."""
import asyncio
import logging

import pytest

from opsweb.lifecycle import Lifecycle

log = logging.getLogger("test.lifecycle")


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_main_result_is_returned_and_spawned_tasks_are_cancelled_when_it_ends():
    before = asyncio.all_tasks()
    life = Lifecycle("t", log)
    cancelled = []

    async def forever():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        life.spawn(forever())
        await asyncio.sleep(0.01)
        return 7

    assert await life.run(main()) == 7
    assert cancelled == [True]
    assert asyncio.all_tasks() == before


async def test_shutdown_ends_main_and_every_task_within_the_run():
    before = asyncio.all_tasks()
    life = Lifecycle("t", log)

    async def main():
        for _ in range(3):
            life.spawn(asyncio.sleep(60))
        await asyncio.sleep(60)

    run = asyncio.create_task(life.run(main()))
    await asyncio.sleep(0.01)
    life.shutdown()
    assert await asyncio.wait_for(run, 1.0) is None
    assert asyncio.all_tasks() == before


async def test_a_spawned_task_that_raises_is_logged_and_the_others_go_on(caplog):
    life = Lifecycle("t", log)
    ticks = []

    async def boom():
        raise RuntimeError("one bad send")

    async def ticking():
        while True:
            ticks.append(1)
            await asyncio.sleep(0.01)

    async def main():
        life.spawn(ticking())
        life.spawn(boom(), "the bad send")
        await asyncio.sleep(0.1)
        return "done"

    with caplog.at_level(logging.ERROR, "test.lifecycle"):
        assert await life.run(main()) == "done"
    assert len(ticks) >= 5                          # not cancelled by its sibling's crash
    assert any("the bad send failed" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_main_raising_cancels_the_rest_and_comes_out_as_itself():
    before = asyncio.all_tasks()
    life = Lifecycle("t", log)

    async def main():
        life.spawn(asyncio.sleep(60))
        await asyncio.sleep(0.01)
        raise KeyError("worker crashed")

    with pytest.raises(KeyError, match="worker crashed"):
        await life.run(main())
    await settle()
    assert asyncio.all_tasks() == before


async def test_cancelling_run_cancels_its_tasks():
    before = asyncio.all_tasks()
    life = Lifecycle("t", log)

    async def main():
        life.spawn(asyncio.sleep(60))
        await asyncio.sleep(60)

    run = asyncio.create_task(life.run(main()))
    await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert asyncio.all_tasks() == before


async def test_tasks_spawned_outside_run_are_kept_and_ended_by_run_or_shutdown():
    before = asyncio.all_tasks()
    life = Lifecycle("t", log)
    early = life.spawn(asyncio.sleep(60))         # an RPC answered before the loop starts
    assert await life.run(asyncio.sleep(0)) is None
    assert early.cancelled()
    late = life.spawn(asyncio.sleep(0.01, "x"))  # after the loop ended: still runs, as before
    assert await late == "x"
    later = life.spawn(asyncio.sleep(60))
    life.shutdown()
    await settle()
    assert later.cancelled()
    assert asyncio.all_tasks() == before


async def test_a_stop_event_set_from_outside_ends_the_run():
    stop = asyncio.Event()
    life = Lifecycle("t", log, stop=stop)
    run = asyncio.create_task(life.run(asyncio.sleep(60)))
    await asyncio.sleep(0.01)
    stop.set()
    assert await asyncio.wait_for(run, 1.0) is None
