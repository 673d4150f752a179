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
from protocol.membership import is_member
from protocol.messages import ProgressRecord, RunSpec
from protocol.owner import peer_id_of_subkey
from protocol.records import decode_subkey_records, dht_values
from protocol.schedule import Schedule
from protocol.signing import open_signed
from protocol.spot_checks import SpotCheckRecord

logger = logging.getLogger(__name__)
DHT_TIMEOUT_S = 10.0


class PeerRecords:
    """`subkey`: our owned subkey `[owner:<our key>]` (records under it are signed by the DHT's
    RSASignatureValidator); `join_key`: when set, adverts without a valid member proof are dropped."""

    def __init__(self, dht: DHT, run: str, peer_id: str, subkey: bytes, join_key: bytes | None = None,
                 organiser_key: str = ""):
        self.dht = dht
        self.run = run
        self.peer_id = peer_id
        self.subkey = subkey
        self.join_key = join_key
        self.organiser_key = organiser_key   # the spec and schedules count only under this key
        self.bad_records = 0
        self._problem = ""

    async def _get(self, key: str) -> Any:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            found = await self.dht.get(key, latest=True, return_future=True)
        return None if found is None else found.value

    async def _store(self, key: str, message: Any, ttl_s: float, subkey: str | None = None) -> bool:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            return bool(await self.dht.store(key, codec.encode(message), time.time() + ttl_s,
                                             subkey=subkey, return_future=True))

    async def _get_signed(self, key: str, kind: str, expected: type, rank=lambda message: 0) -> Any:
        """The best record of `kind` signed by the run's organiser key. Without a pinned key, the
        first key that signs the run's records is pinned now (trust on first use)."""
        opened = open_signed(dht_values(await self._get(key)), kind, expected, self.organiser_key or None, rank)
        self.bad_records += opened.refused
        if opened.problem and opened.problem != self._problem:
            logger.warning("%s", opened.problem)      # once per distinct problem, not every poll
        self._problem = opened.problem
        if opened.message is not None and not self.organiser_key:
            self.organiser_key = opened.signer
            logger.warning("trusting the organiser key %s of run %r on first use; join with --run %s@%s to accept "
                           "no other from the start", opened.signer, self.run, self.run, opened.signer)
        return opened.message

    async def get_spec(self) -> RunSpec | None:
        return await self._get_signed(ids.spec_key(self.run), "spec", RunSpec)

    async def get_schedule(self) -> Schedule | None:
        return await self._get_signed(ids.schedule_key(self.run), "schedule", Schedule, rank=lambda s: s.epoch)

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
