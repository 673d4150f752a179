"""The peer's side of the DHT schema (architecture.md): it reads the spec and the schedule and
the other peers' adverts, and writes its own advert, links, progress and spot checks under its
owned subkey, through the shared record layer (swarmcore/dht)."""
from hivemind import DHT

from protocol import ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.messages import ProgressRecord, RunSpec
from protocol.schedule import Schedule
from protocol.spot_checks import SpotCheckRecord
from swarmcore.dht.records import RunRecords


class PeerRecords(RunRecords):
    """`subkey`: our owned subkey `[owner:<our key>]` (records under it are signed by the DHT's
    RSASignatureValidator); `join_key`: when set, adverts without a valid member proof are dropped."""

    def __init__(self, dht: DHT, run: str, peer_id: str, subkey: bytes, join_key: bytes | None = None):
        super().__init__(dht, run, join_key)
        self.peer_id = peer_id
        self.subkey = subkey

    async def get_spec(self) -> RunSpec | None:
        return await self._get_one(ids.spec_key(self.run), RunSpec)

    async def get_schedule(self) -> Schedule | None:
        return await self._get_one(ids.schedule_key(self.run), Schedule)

    async def put_advert(self, advert: PeerAdvert, ttl_s: float) -> bool:
        return await self._store(ids.peers_key(self.run), advert, ttl_s, subkey=self.subkey)

    async def put_links(self, report: LinkReport, ttl_s: float) -> bool:
        return await self._store(ids.links_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_progress(self, report: ProgressRecord, ttl_s: float) -> bool:
        return await self._store(ids.progress_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_spot_checks(self, record: SpotCheckRecord, ttl_s: float) -> bool:
        return await self._store(ids.spot_checks_key(self.run), record, ttl_s, subkey=self.subkey)
