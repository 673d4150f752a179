"""CoordinatorApp's lifecycle (issue 22) on a fake DHT: run() serves until shutdown(), then
removes its maddrs file, shuts its DHT down and leaves no task; a round stuck on the DHT does
not hold the stop up."""
import asyncio

from coordinator import app as coordinator_app
from coordinator.app import CoordinatorApp
from coordinator.config import CoordinatorConfig


class FakeDHT:
    def __init__(self, **kwargs):
        self.shut = False

    def get_visible_maddrs(self):
        return ["/ip4/127.0.0.1/tcp/1/p2p/QmFake"]


class FakeRecords:
    stuck = False       # get_adverts never returns: a DHT whose p2pd is gone

    def __init__(self, dht, run, join_key, organiser, public_key, admission=None):
        self.organiser = organiser
        self.rounds = 0

    async def put_spec(self, spec):
        pass

    async def get_schedule(self):
        return None

    async def get_adverts(self):
        self.rounds += 1
        if self.stuck:
            await asyncio.Event().wait()
        return {}

    async def get_spot_checks(self):
        return {}

    async def get_links(self):
        return {}

    async def get_progress(self):
        return {}


def patched(monkeypatch, tmp_path, stuck: bool) -> CoordinatorApp:
    monkeypatch.setattr(coordinator_app, "DHT", FakeDHT)
    monkeypatch.setattr(coordinator_app, "safe_for_large_calls", lambda dht: dht)
    monkeypatch.setattr(coordinator_app, "shutdown_dht", lambda dht: setattr(dht, "shut", True))
    monkeypatch.setattr(coordinator_app, "CoordinatorRecords", FakeRecords)
    monkeypatch.setattr(FakeRecords, "stuck", stuck)
    return CoordinatorApp(CoordinatorConfig(run="t", num_stages=2, skip_ratio=0.0, poll_interval_s=0.02,
                                            maddrs_file=str(tmp_path / "maddrs")))


async def serve_then_stop(app: CoordinatorApp, tmp_path) -> None:
    before = asyncio.all_tasks()
    running = asyncio.create_task(app.run())
    await asyncio.wait_for(app.ready.wait(), 5.0)
    assert (tmp_path / "maddrs").read_text().startswith("/ip4/127.0.0.1")
    await asyncio.sleep(0.1)
    assert app.records.rounds >= 1
    app.shutdown()
    assert await asyncio.wait_for(running, 1.0) == 0
    assert app.dht.shut and not (tmp_path / "maddrs").exists()
    assert asyncio.all_tasks() == before


async def test_shutdown_ends_the_rounds_and_cleans_up(monkeypatch, tmp_path):
    await serve_then_stop(patched(monkeypatch, tmp_path, stuck=False), tmp_path)


async def test_a_round_stuck_on_the_dht_does_not_hold_the_stop_up(monkeypatch, tmp_path):
    await serve_then_stop(patched(monkeypatch, tmp_path, stuck=True), tmp_path)
