"""peer/discovery/announcer.py with fake DHT records: a stalled store must neither stop the
refresh cadence nor let the advert lapse; expiries never go backwards."""
import asyncio
import time

from protocol.adverts import PeerAdvert, PeerState

from peer.discovery.announcer import MAX_IN_FLIGHT, MAX_STRETCH_S, Announcer


class FakeRecords:
    """put_advert takes `delays[i]` seconds for the i-th store (0 once they run out)."""

    def __init__(self, delays=()):
        self.delays = list(delays)
        self.stores: list[tuple[float, float, PeerAdvert]] = []   # (started, expiry, advert)
        self.in_flight = 0
        self.max_in_flight = 0
        self.ttls: list[float] = []

    async def put_advert(self, advert: PeerAdvert, ttl_s: float) -> bool:
        self.stores.append((time.monotonic(), time.time() + ttl_s, advert))
        self.ttls.append(ttl_s)
        delay = self.delays.pop(0) if self.delays else 0.0
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(delay)
        finally:
            self.in_flight -= 1
        return True


def advert() -> PeerAdvert:
    return PeerAdvert("peer-a", PeerState.JOINING, "cpu", 1, 0.01)


async def run_for(announcer: Announcer, seconds: float) -> None:
    task = asyncio.create_task(announcer.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_fast_stores_refresh_every_period_with_the_base_ttl():
    records = FakeRecords()
    announcer = Announcer(records, advert(), period_s=0.1)
    await run_for(announcer, 0.55)
    assert 5 <= len(records.stores) <= 7
    assert abs(announcer.ttl_s - 0.2) < 0.05


async def test_a_stalled_store_keeps_the_cadence_and_stretches_the_expiry():
    records = FakeRecords(delays=[0.6])                       # the first store stalls 6 periods
    announcer = Announcer(records, advert(), period_s=0.1)
    await run_for(announcer, 0.75)                            # the stalled store ends at 0.6 s
    starts = [s for s, _, _ in records.stores]
    assert len(starts) >= 4, starts                           # the stall did not stop the refreshes
    assert all(b - a < 0.2 for a, b in zip(starts, starts[1:])), starts
    assert records.max_in_flight <= MAX_IN_FLIGHT
    # stores launched while the first is pending already expire later (by its age so far)
    assert records.ttls[3] > records.ttls[0] + 0.25, records.ttls
    assert announcer.ttl_s > 0.2 + 0.5                        # expiry covers a store that slow


async def test_the_stretch_is_capped_and_expiries_never_go_backwards():
    records = FakeRecords(delays=[MAX_STRETCH_S + 5])
    announcer = Announcer(records, advert(), period_s=0.05)
    first = asyncio.create_task(announcer.announce_once())
    await asyncio.sleep(0)
    first.cancel()                                            # as the run loop does on shutdown
    await asyncio.gather(first, return_exceptions=True)
    announcer._durations.append(MAX_STRETCH_S + 5)            # as if it had taken that long
    assert announcer.ttl_s <= 2 * 0.05 + MAX_STRETCH_S
    announcer._durations.clear()                              # stores are fast again: ttl shrinks
    announcer.update(state=PeerState.ONLINE)
    await announcer.go_offline()
    expiries = [e for _, e, _ in records.stores]
    assert expiries == sorted(expiries), expiries             # the newest advert is the one kept
    assert records.stores[-1][2].state is PeerState.OFFLINE


async def test_update_goes_out_at_once():
    records = FakeRecords()
    announcer = Announcer(records, advert(), period_s=5.0)
    task = asyncio.create_task(announcer.run())
    await asyncio.sleep(0.05)
    announcer.update(state=PeerState.ONLINE)
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [a.state for _, _, a in records.stores] == [PeerState.JOINING, PeerState.ONLINE]


async def test_shutdown_ends_run_and_cancels_the_stores_in_flight():
    before = asyncio.all_tasks()
    records = FakeRecords(delays=[60.0])                      # a store stalled on a cut-off node
    announcer = Announcer(records, advert(), period_s=0.05)
    task = asyncio.create_task(announcer.run())
    await asyncio.sleep(0.12)
    assert records.in_flight >= 1
    announcer.shutdown()
    await asyncio.wait_for(task, 1.0)
    assert records.in_flight == 0                             # the stalled store was cancelled
    assert asyncio.all_tasks() == before
