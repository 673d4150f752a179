"""Inbox.take: planned order, timeouts, and pokes (IterationDone must end a wait at once)."""
import asyncio
import time

from peer.pipeline.inbox import Inbox
from peer.pipeline.plan_view import Kind, TaskKey

FWD = Kind.FORWARD


async def test_take_returns_the_lowest_priority_ready_task():
    box = Inbox()
    await box.put(0, TaskKey(1, FWD, 1), "b")
    await box.put(0, TaskKey(0, FWD, 1), "a")
    await box.put(1, TaskKey(2, FWD, 1), "next iteration")
    got = await box.take(0, lambda t: True, lambda t: t.microbatch_id, 0.1)
    assert got == (TaskKey(0, FWD, 1), "a")
    assert len(box) == 2


async def test_equal_priorities_go_in_the_order_they_arrived():
    box = Inbox()
    for mb in (5, 2, 9):
        await box.put(0, TaskKey(mb, FWD, 1), mb)
    await box.put(0, TaskKey(1, Kind.BACKWARD, 1), "backward")
    order = [(await box.take(0, lambda t: True, lambda t: 0, 0.1))[1] for _ in range(4)]
    assert order == [5, 2, 9, "backward"]               # not by microbatch id
    box.drop_before(1)
    await box.put(0, TaskKey(3, FWD, 1), 3)                # the bookkeeping survives a drop and reuse
    await box.put(0, TaskKey(2, FWD, 1), 2)
    assert (await box.take(0, lambda t: True, lambda t: 0, 0.1))[1] == 3


async def test_take_times_out_when_nothing_is_ready():
    box = Inbox()
    await box.put(1, TaskKey(0, FWD, 1), "later")
    assert await box.take(0, lambda t: True, lambda t: 0, 0.05) is None


async def test_poke_ends_a_waiting_take_promptly():
    box = Inbox()
    started = time.monotonic()
    waiting = asyncio.create_task(box.take(0, lambda t: True, lambda t: 0, 5.0))
    await asyncio.sleep(0.05)
    await box.poke()
    assert await asyncio.wait_for(waiting, 1.0) is None
    assert time.monotonic() - started < 1.0          # not the 5 s timeout


async def test_a_poke_before_take_does_not_end_the_next_wait_early():
    box = Inbox()
    await box.poke()
    started = time.monotonic()
    assert await box.take(0, lambda t: True, lambda t: 0, 0.2) is None
    assert time.monotonic() - started >= 0.15
