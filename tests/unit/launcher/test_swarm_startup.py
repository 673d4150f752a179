"""skippipe-swarm notices a peer that exits before the first schedule instead of waiting out
--timeout (launcher/swarm.py startup_failure), and tells the peers to leave once the run's last
iteration is summarised (run_ended)."""
import asyncio
import subprocess
import sys
import time

import pytest

from launcher.swarm import run_ended, startup_failure


class FakeApp:
    schedule = None


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_a_peer_exiting_before_the_first_schedule_is_reported_with_its_log(tmp_path):
    (tmp_path / "peer1.log").write_text("starting\nAttributeError: no such setting\n")

    async def main():
        coordinator = asyncio.create_task(asyncio.sleep(60))
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        try:
            t0 = time.monotonic()
            why = await startup_failure([alive, dead], FakeApp(), tmp_path, coordinator, t0 + 30, poll_s=0.05)
            return why, time.monotonic() - t0
        finally:
            alive.kill()
            alive.wait()
            coordinator.cancel()
    why, waited = run(main())
    assert waited < 5
    assert "peer 1 exited with code 3" in why and "AttributeError: no such setting" in why


def test_once_planned_a_dead_peer_is_churn_not_a_startup_failure(tmp_path):
    app = FakeApp()

    async def main():
        coordinator = asyncio.create_task(asyncio.sleep(60))
        dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
        dead.wait()
        app.schedule = object()          # the coordinator has planned
        try:
            return await startup_failure([dead], app, tmp_path, coordinator, time.monotonic() + 30, poll_s=0.05)
        finally:
            coordinator.cancel()
    assert run(main()) is None


class EndingApp:
    def __init__(self):
        self.ended = asyncio.Event()


def test_the_peers_go_once_the_last_iteration_is_summarised_not_after_the_dht_closes():
    async def main():
        app = EndingApp()

        async def coordinator_run():          # summarises its last iteration, then closes its DHT
            await asyncio.sleep(0.1)
            app.ended.set()
            await asyncio.sleep(30)
        coordinator = asyncio.create_task(coordinator_run())
        try:
            t0 = time.monotonic()
            await run_ended(app, coordinator, timeout_s=20)
            return time.monotonic() - t0
        finally:
            coordinator.cancel()
    assert run(main()) < 5


def test_a_run_that_neither_ends_nor_fails_times_out_and_a_failed_one_raises():
    async def main(body, timeout_s):
        app = EndingApp()
        coordinator = asyncio.create_task(body())
        try:
            await run_ended(app, coordinator, timeout_s=timeout_s)
        finally:
            coordinator.cancel()

    async def hangs():
        await asyncio.sleep(30)

    async def fails():
        raise RuntimeError("the DHT did not start")
    with pytest.raises(TimeoutError):
        run(main(hangs, 0.2))
    with pytest.raises(RuntimeError, match="the DHT did not start"):
        run(main(fails, 10))
