"""Keeps this peer's advert alive in the DHT: JOINING -> ONLINE -> OFFLINE, refreshed well
before it expires (expiry = 2 x period, so one missed refresh is tolerated).

A DHT store can stall for seconds when a node on its path is cut off (hivemind waits out its
RPC timeout). So stores go out on a fixed cadence without waiting for the previous one (at most
MAX_IN_FLIGHT at once), and as soon as one is slow (recent, or still in flight past half a
period) the expiry stretches by MAX_STRETCH_S at once: a store that meets a cut-off node takes
two of hivemind's RPC timeouts (6 s measured), and stretching only by the delay seen so far left
healthy peers' adverts lapsed for seconds (the coordinator took them for departures).

run() owns the stores in flight (opsweb/lifecycle.py); shutdown() ends it and cancels them."""
import asyncio
import collections
import dataclasses
import logging
import time

from opsweb.lifecycle import Lifecycle

from protocol.adverts import PeerAdvert, PeerState

from peer.discovery.dht_records import PeerRecords

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4         # a store waiting out a cut node's RPC timeout (~6 s) spans 4 periods
MAX_STRETCH_S = 10.0      # covers a store stalled by one cut-off node (~6 s); slower is a dead DHT
RECENT_STORES = 5
GOODBYE_TIMEOUT_S = 3.0   # peers leaving together cannot store for each other: do not hang on it


class Announcer:
    def __init__(self, records: PeerRecords, advert: PeerAdvert, period_s: float):
        self.records = records
        self.advert = advert
        self.period_s = period_s
        self._wake = asyncio.Event()
        self._durations: collections.deque[float] = collections.deque(maxlen=RECENT_STORES)
        self._in_flight: dict[asyncio.Task, float] = {}      # task -> monotonic start
        self._last_expiry = 0.0
        self.life = Lifecycle("the announcer", logger)

    def update(self, **changes) -> None:
        """Change advert fields; the new advert goes out at once."""
        self.advert = dataclasses.replace(self.advert, **changes)
        self._wake.set()

    @property
    def ttl_s(self) -> float:
        """2 x period, plus MAX_STRETCH_S while stores are slow."""
        pending = [time.monotonic() - t for t in self._in_flight.values()]
        slowest = max([*self._durations, *pending], default=0.0)
        # a store under half a period is normal: no stretch, so a dead peer's advert expires
        # as quickly as ever (the coordinator's re-plan clock starts there)
        stretch = MAX_STRETCH_S if slowest > self.period_s / 2 else 0.0
        return 2 * self.period_s + stretch

    async def announce_once(self) -> bool:
        now = time.time()
        advert = dataclasses.replace(self.advert, timestamp=now)
        # the DHT keeps the record that expires last, so a newer advert must never expire
        # sooner than an older one (the stretch shrinks once stores are fast again)
        self._last_expiry = max(now + self.ttl_s, self._last_expiry + 1e-3)
        started = time.monotonic()
        try:
            stored = await self.records.put_advert(advert, ttl_s=self._last_expiry - now)
        except Exception as exc:  # DHT hiccups must not stop the loop; the next try may work
            logger.warning("announcing failed: %s", str(exc) or type(exc).__name__)
            stored = False
        took = time.monotonic() - started
        self._durations.append(took)
        if took > self.period_s:
            logger.warning("announcing took %.1fs (period %.1fs): the DHT is slow, advert "
                           "expiry stretched to %.1fs", took, self.period_s, self.ttl_s)
        return stored

    def _launch(self) -> None:
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            return              # the stores in flight carry the same advert within a period
        task = self.life.spawn(self.announce_once(), "storing the advert")
        self._in_flight[task] = time.monotonic()
        task.add_done_callback(lambda t: self._in_flight.pop(t, None))

    async def run(self) -> None:
        """Refreshes until shutdown() (or cancelled); the stores still in flight are cancelled."""
        await self.life.run(self._refresh())

    def shutdown(self) -> None:
        self.life.shutdown()

    async def _refresh(self) -> None:
        while True:
            self._wake.clear()
            self._launch()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.period_s)
            except TimeoutError:
                pass

    async def go_offline(self) -> None:
        """Announce OFFLINE, bounded: if the DHT does not take it in time the advert simply
        expires (within ttl_s) and the swarm treats this peer as departed then."""
        self.advert = dataclasses.replace(self.advert, state=PeerState.OFFLINE)
        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                await self.announce_once()
        except TimeoutError:
            logger.info("the OFFLINE advert was not stored within %.0fs; the last one expires instead",
                        GOODBYE_TIMEOUT_S)
