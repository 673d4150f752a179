"""skippipe-swarm notices a peer that exits before the first schedule instead of waiting out
--timeout (launcher/swarm.py startup_failure)."""
import asyncio
import subprocess
import sys
import time

from launcher.swarm import startup_failure


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
