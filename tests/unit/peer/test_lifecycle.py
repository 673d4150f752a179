"""PeerApp's serving lifecycle (issue 22) on fakes: the work loop, the announcer and the
watchers run in one TaskGroup; a stop ends them all and leaves no task; a crashed watcher is
logged and the work goes on; a crashed work loop ends the peer with its own exception."""
import asyncio
import logging
from types import SimpleNamespace

import pytest

from protocol.adverts import PeerAdvert, PeerState

from peer.app import PeerApp
from peer.config import PeerConfig
from peer.discovery.announcer import Announcer
from peer.discovery.schedule_watcher import ScheduleWatcher
from peer.pipeline.ledger import Ledger
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.wire import WireCompression


class FakeRecords:
    def __init__(self):
        self.adverts = 0
        self.progress = 0

    async def put_advert(self, advert, ttl_s):
        self.adverts += 1
        return True

    async def get_schedule(self):
        return None

    async def get_adverts(self):
        return {}

    async def put_progress(self, record, ttl_s):
        self.progress += 1


class FakeWorker:
    def __init__(self, work):
        self.work, self.ledger, self.shut = work, Ledger(), False
        self.sender = SimpleNamespace(wire=WireCompression("auto", {}, "me"))   # the end-of-run log line reads it

    async def run(self):
        await self.work()

    def shutdown(self):
        self.shut = True


async def forever():
    await asyncio.Event().wait()


def app_with(work, guard_run=None, **config) -> PeerApp:
    app = PeerApp(PeerConfig(initial_peers=("/ip4/127.0.0.1/tcp/1/p2p/Qm",), link_probe_period_s=0.0,
                             status_interval_s=60.0, announce_period_s=0.05, **config))
    app.records = FakeRecords()
    app.announcer = Announcer(app.records, PeerAdvert("me", PeerState.ONLINE, "cpu", 1, 0.01), 0.05)
    app.worker, app.book, app.rpc = FakeWorker(work), ScheduleBook(), None
    app.schedules = ScheduleWatcher(app.records, app.book, app.config.run, app.announcer, app.config.dht_poll_s)
    app.guard = SimpleNamespace(run=guard_run or (lambda period_s: forever()))
    return app


async def test_a_stop_ends_the_work_loop_and_every_background_loop():
    before = asyncio.all_tasks()
    app = app_with(forever)
    serving = asyncio.create_task(app.life.run(app._serve()))
    await asyncio.sleep(0.2)
    assert app.records.adverts >= 2                       # the announcer ran meanwhile
    app.shutdown()
    await asyncio.wait_for(serving, 1.0)
    assert asyncio.all_tasks() == before


async def test_a_crashed_watcher_is_logged_and_the_work_goes_on(caplog):
    async def broken_guard(period_s):
        raise RuntimeError("guard refresh broke")

    app = app_with(lambda: asyncio.sleep(0.3), guard_run=broken_guard, linger_s=0.0)
    with caplog.at_level(logging.ERROR, "skippipe.peer"):
        await asyncio.wait_for(app.life.run(app._serve()), 2.0)   # the work loop ran to its end
    assert any("guard refresh broke" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_a_crashed_work_loop_ends_the_peer_with_its_own_exception():
    before = asyncio.all_tasks()

    async def crash():
        await asyncio.sleep(0.05)
        raise ValueError("the worker broke")

    app = app_with(crash)
    with pytest.raises(ValueError, match="the worker broke"):
        await asyncio.wait_for(app.life.run(app._serve()), 2.0)
    assert asyncio.all_tasks() == before


async def test_after_the_run_the_peer_lingers_republishing_its_progress():
    app = app_with(lambda: asyncio.sleep(0), linger_s=0.3)
    app.progress_publisher.kick()
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(app.life.run(app._serve()), 2.0)
    assert asyncio.get_running_loop().time() - started >= 0.3
    assert app.records.progress >= 1


async def test_a_peer_that_skipped_epochs_reads_them_from_the_coordinators_earlier_records():
    """Stopped while epoch 3 was current, a peer reads 4 next: it finds the gap and takes 3 (and
    the one the swarm ran) from the coordinator's earlier records; without a gap it reads nothing."""
    from tests.unit.tokendata.test_sample_cursor import schedule
    app = app_with(forever, run="t")
    s1, s3, s4 = (schedule(2, start=start, epoch=e) for e, start in ((1, 0), (3, 30), (4, 42)))
    newest, earlier_reads = [s1], []

    async def get_schedule():
        return newest[-1]

    async def get_earlier_schedules():
        earlier_reads.append(1)
        return [s1, s3]
    app.records.get_schedule, app.records.get_earlier_schedules = get_schedule, get_earlier_schedules
    await app.schedules.refresh()
    newest.append(s4)
    await app.schedules.refresh()
    assert earlier_reads == [1] and [s.epoch for s in app.book._schedules] == [1, 3, 4]
    assert app.book.for_iteration(31) is s3
    await app.schedules.refresh()                 # nothing new: no read
    assert earlier_reads == [1]
