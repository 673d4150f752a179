"""Keeps this peer's advert alive in the DHT: JOINING -> ONLINE -> OFFLINE, refreshed well
before it expires (expiry = 2 x period, so one missed refresh is tolerated)."""
import asyncio
import dataclasses
import logging
import time

from protocol.adverts import PeerAdvert, PeerState

from peer.discovery.dht_records import PeerRecords

logger = logging.getLogger(__name__)


class Announcer:
    def __init__(self, records: PeerRecords, advert: PeerAdvert, period_s: float):
        self.records = records
        self.advert = advert
        self.period_s = period_s
        self._wake = asyncio.Event()

    def update(self, **changes) -> None:
        """Change advert fields; the new advert goes out at once."""
        self.advert = dataclasses.replace(self.advert, **changes)
        self._wake.set()

    async def announce_once(self) -> bool:
        advert = dataclasses.replace(self.advert, timestamp=time.time())
        try:
            return await self.records.put_advert(advert, ttl_s=2 * self.period_s)
        except Exception as exc:  # DHT hiccups must not stop the loop; the next try may work
            logger.warning("announcing failed: %s", exc)
            return False

    async def run(self) -> None:
        while True:
            await self.announce_once()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.period_s)
            except TimeoutError:
                pass

    async def go_offline(self) -> None:
        self.advert = dataclasses.replace(self.advert, state=PeerState.OFFLINE)
        await self.announce_once()
