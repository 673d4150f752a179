"""The peer's side of the DHT schema (architecture.md): read the spec and schedule, write
our advert, links and progress. Every call awaits hivemind's future (never blocks the loop)
and is bounded by a timeout; bad records are skipped, never trusted."""
import asyncio
import logging
import time
from typing import Any

from hivemind import DHT

from protocol import codec, ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.errors import ProtocolError
from protocol.membership import is_member
from protocol.messages import ProgressRecord, RunSpec
from protocol.owner import peer_id_of_subkey
from protocol.records import decode_subkey_records
from protocol.schedule import Schedule
from protocol.spot_checks import SpotCheckRecord

logger = logging.getLogger(__name__)
DHT_TIMEOUT_S = 10.0


class PeerRecords:
    """`subkey`: our owned subkey `[owner:<our key>]` (records under it are signed by the DHT's
    RSASignatureValidator); `join_key`: when set, adverts without a valid member proof are dropped."""

    def __init__(self, dht: DHT, run: str, peer_id: str, subkey: bytes, join_key: bytes | None = None):
        self.dht = dht
        self.run = run
        self.peer_id = peer_id
        self.subkey = subkey
        self.join_key = join_key
        self.bad_records = 0

    async def _get(self, key: str) -> Any:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            found = await self.dht.get(key, latest=True, return_future=True)
        return None if found is None else found.value

    async def _get_one(self, key: str, expected: type) -> Any:
        value = await self._get(key)
        if value is None:
            return None
        try:
            return codec.decode(value, expected=expected)
        except ProtocolError as exc:
            logger.warning("ignoring a malformed %s record: %s", expected.__name__, exc)
            return None

    async def _store(self, key: str, message: Any, ttl_s: float, subkey: str | None = None) -> bool:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            return bool(await self.dht.store(key, codec.encode(message), time.time() + ttl_s,
                                             subkey=subkey, return_future=True))

    async def get_spec(self) -> RunSpec | None:
        return await self._get_one(ids.spec_key(self.run), RunSpec)

    async def get_schedule(self) -> Schedule | None:
        return await self._get_one(ids.schedule_key(self.run), Schedule)

    async def get_adverts(self) -> dict[str, PeerAdvert]:
        value = await self._get(ids.peers_key(self.run))
        records = {k: v.value for k, v in value.items()} if isinstance(value, dict) else {}
        adverts, problems = decode_subkey_records(records, PeerAdvert, owner_of=peer_id_of_subkey)
        if self.join_key is not None:
            adverts = {p: a for p, a in adverts.items() if is_member(self.join_key, self.run, p, a.member_proof)}
        self.bad_records += len(problems)
        return adverts

    async def put_advert(self, advert: PeerAdvert, ttl_s: float) -> bool:
        return await self._store(ids.peers_key(self.run), advert, ttl_s, subkey=self.subkey)

    async def put_links(self, report: LinkReport, ttl_s: float) -> bool:
        return await self._store(ids.links_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_progress(self, report: ProgressRecord, ttl_s: float) -> bool:
        return await self._store(ids.progress_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_spot_checks(self, record: SpotCheckRecord, ttl_s: float) -> bool:
        return await self._store(ids.spot_checks_key(self.run), record, ttl_s, subkey=self.subkey)
