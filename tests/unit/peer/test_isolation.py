"""peer/isolation.py: a peer notices it is cut off only when the DHT view collapsed AND nobody
answers a dial, and notices when it is back (issue 9)."""
import asyncio
import time
from types import SimpleNamespace

from protocol.adverts import PeerState
from peer.isolation import IsolationMonitor
from peer.pipeline.rejoin import Isolation
from peer.pipeline.schedule_book import ScheduleBook
from peer.routing.health import Health
from peer.transport.base import TransportError

SCHEDULED = ["me", "a", "b", "c"]


class Records:
    def __init__(self):
        self.visible: list[str] | None = SCHEDULED

    async def get_adverts(self):
        if self.visible is None:
            raise TimeoutError("DHT lookup timed out")
        return {p: SimpleNamespace(state=PeerState.ONLINE) for p in self.visible}


class Rpc:
    def __init__(self):
        self.reachable = True
        self.calls = 0

    async def call(self, peer, message, timeout):
        self.calls += 1
        if not self.reachable:
            raise TransportError(peer, "failed to dial")
        return None


def monitor():
    worker = SimpleNamespace(health=Health(), isolation=Isolation(), book=ScheduleBook(),
                             ledger=SimpleNamespace(current=None))     # the parts the monitor shares
    records, rpc = Records(), Rpc()
    return IsolationMonitor(worker.isolation, worker.health, worker.ledger, worker.book, records, rpc, "me",
                            announce_period_s=0.05), worker, records, rpc


async def checks(mon, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await mon.check(SCHEDULED)
        await asyncio.sleep(0.02)


def test_a_collapsed_view_with_peers_still_answering_is_not_a_cut_off_nor_departures():
    async def go():
        mon, worker, records, rpc = monitor()
        records.visible = ["me"]                 # the DHT lookup lost everyone else
        await checks(mon, 0.4)
        assert rpc.calls > 0                      # it did dial to find out
        assert not worker.isolation.cut_off
        assert worker.health.departed == set()    # and declared nobody departed
    asyncio.run(go())


def test_no_view_and_no_answer_is_a_cut_off_and_a_sound_view_ends_it():
    async def go():
        mon, worker, records, rpc = monitor()
        await checks(mon, 0.05)
        records.visible, rpc.reachable = None, False
        await checks(mon, 0.05)
        assert not worker.isolation.cut_off       # not before the grace period
        await checks(mon, 0.4)
        assert worker.isolation.cut_off and worker.isolation.away
        assert worker.health.departed == set()
        records.visible, rpc.reachable = SCHEDULED, True
        await mon.check(SCHEDULED)
        assert not worker.isolation.cut_off
        assert worker.isolation.away              # until the worker has rejoined
    asyncio.run(go())


def test_while_cut_off_an_answering_peer_ends_it_even_if_the_dht_lags():
    async def go():
        mon, worker, records, rpc = monitor()
        records.visible, rpc.reachable = ["me"], False
        await checks(mon, 0.4)
        assert worker.isolation.cut_off
        rpc.reachable = True
        await checks(mon, 0.3)
        assert not worker.isolation.cut_off
    asyncio.run(go())


def test_a_peer_that_took_our_call_just_now_proves_the_link_without_a_dial():
    async def go():
        mon, worker, records, rpc = monitor()
        await checks(mon, 0.05)
        records.visible, rpc.reachable = None, False   # no view, and our pings go unanswered...
        for _ in range(10):
            worker.health.record_success("b")        # ...but our work reaches b
            await checks(mon, 0.05)
        assert not worker.isolation.cut_off
        await checks(mon, 0.4)                        # once b too stops answering: cut off
        assert worker.isolation.cut_off
    asyncio.run(go())
