"""The shared-swarm fixture's runner (tests/swarm/live.py) never waits forever: a coroutine that
blocks the swarm's event loop (so asyncio's own timeout cannot fire) fails its test with the
loop thread's stack a grace period later, instead of hanging the suite until CI is killed."""
import asyncio
import time

import pytest

import tests.swarm.live as live


def test_a_blocked_loop_fails_the_caller_with_its_stack(monkeypatch):
    monkeypatch.setattr(live, "LOOP_GRACE_S", 0.3)
    swarm = live.LiveSwarm()

    async def blocks_the_loop():
        time.sleep(1.0)

    try:
        assert swarm.run(asyncio.sleep(0, result=7), 5) == 7
        with pytest.raises(TimeoutError):                 # the coroutine's own timeout, as before
            swarm.run(asyncio.sleep(5), 0.1)
        started = time.monotonic()
        with pytest.raises(AssertionError, match="blocks_the_loop"):
            swarm.run(blocks_the_loop(), 0.1)
        assert time.monotonic() - started < 0.9          # not the 1 s the loop stays blocked
    finally:
        time.sleep(1.0)                                  # the blocked call ends; then the loop stops
        swarm.loop.call_soon_threadsafe(swarm.loop.stop)
        swarm._thread.join(timeout=5)
        swarm.loop.close()
