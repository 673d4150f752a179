"""The peer's side of the DHT schema (architecture.md): it reads the spec and the schedule and
the other peers' adverts, and writes its own advert, links, progress and spot checks under its
owned subkey, through the shared record layer (swarmcore/dht)."""
import logging
from typing import Any

from hivemind import DHT

from protocol import ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.messages import ProgressRecord, RunSpec
from swarmcore.dht.subkey_records import dht_values
from protocol.schedule import Schedule
from swarmcore.dht.signed_records import open_signed
from protocol.spot_checks import SpotCheckRecord
from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.records import RunRecords

logger = logging.getLogger(__name__)


class PeerRecords(RunRecords):
    """`subkey`: our owned subkey `[owner:<our key>]` (records under it are signed by the DHT's
    RSASignatureValidator); `join_key`: when set, adverts without a valid member proof are dropped."""

    def __init__(self, dht: DHT, run: str, peer_id: str, subkey: bytes, join_key: bytes | None = None,
                 organiser_key: str = "", admission: AdmissionRules | None = None):
        super().__init__(dht, run, join_key, admission)
        self.peer_id = peer_id
        self.subkey = subkey
        self.organiser_key = organiser_key   # the spec and schedules count only under this key
        self._problem = ""

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

    async def get_earlier_schedules(self) -> list[Schedule]:
        """The schedules the coordinator stored beside the newest: the one the swarm ran when it
        was published and the one published just before it (read by a peer that skipped epochs)."""
        found = [await self._get_signed(key(self.run), "schedule", Schedule, rank=lambda s: s.epoch)
                 for key in (ids.previous_schedule_key, ids.superseded_schedule_key)]
        return [s for s in found if s is not None]

    async def put_advert(self, advert: PeerAdvert, ttl_s: float) -> bool:
        return await self._store(ids.peers_key(self.run), advert, ttl_s, subkey=self.subkey)

    async def put_links(self, report: LinkReport, ttl_s: float) -> bool:
        return await self._store(ids.links_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_progress(self, report: ProgressRecord, ttl_s: float) -> bool:
        return await self._store(ids.progress_key(self.run), report, ttl_s, subkey=self.subkey)

    async def put_spot_checks(self, record: SpotCheckRecord, ttl_s: float) -> bool:
        return await self._store(ids.spot_checks_key(self.run), record, ttl_s, subkey=self.subkey)
