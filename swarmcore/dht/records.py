"""Reading and writing one run's DHT records: every call awaits hivemind's future (never
blocks the loop) and is bounded by a timeout; malformed or forged records are skipped and
counted, never trusted. The coordinator and the peer each add the records they write."""
import asyncio
import logging
import time
from typing import Any

from hivemind import DHT

from protocol import codec, ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.invitations import Roster
from protocol.messages import ProgressRecord
from protocol.owner import peer_id_of_subkey
from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.signed_records import open_signed
from swarmcore.dht.subkey_records import decode_subkey_records, dht_values

logger = logging.getLogger(__name__)
DHT_TIMEOUT_S = 10.0
# How many of the nodes nearest a key a write, and a read of a single-writer record (the spec,
# the schedule, the roster), visit: hivemind's num_replicas (5), the nodes a write lands on.
# hivemind's default beam is its bucket size (20), so in a swarm of fewer nodes every read, and
# every write's search, asked all of them, each answer carrying the key's whole dictionary,
# validated record by record: a third of a 12-peer local swarm's CPU (docs/results.md). Reads of
# the per-peer dictionaries (adverts, links, progress, spot checks) keep the wide beam: they
# merge every peer's record from every node they visit, and one peer's write may have landed on
# nodes a little off another's view of the nearest in a large swarm. The coordinator re-stores
# the spec and the newest schedule, so they sit on the nodes nearest their keys now.
DHT_BEAM = 5


class RunRecords:
    """`admission` (or a `join_key` alone): a private run, whose non-members' records are
    dropped (adverts counted in `non_members`; swarmcore/dht/admission.py); `bad_records`
    counts the malformed or forged ones skipped."""

    def __init__(self, dht: DHT, run: str, join_key: bytes | None = None, admission: AdmissionRules | None = None):
        self.dht = dht
        self.run = run
        self.join_key = join_key
        if admission is None and join_key is not None:
            admission = AdmissionRules(run, join_key)
        self.admission = admission
        self.bad_records = 0
        self.non_members = 0

    async def _store(self, key: str, message: Any, ttl_s: float, subkey: bytes | None = None) -> bool:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            return bool(await self.dht.store(key, codec.encode(message), time.time() + ttl_s,
                                             subkey=subkey, return_future=True, beam_size=DHT_BEAM))

    async def _get(self, key: str, beam: int | None = DHT_BEAM) -> Any:
        """The key's value, visiting `beam` of its nearest nodes (None: hivemind's default)."""
        extra = {} if beam is None else {"beam_size": beam}
        async with asyncio.timeout(DHT_TIMEOUT_S):
            found = await self.dht.get(key, latest=True, return_future=True, **extra)
        return None if found is None else found.value

    async def _subkeys(self, key: str, expected: type) -> dict[str, Any]:
        """Each peer's record under `key`, by peer id; only records its owner signed."""
        value = await self._get(key, beam=None)
        records = {k: v.value for k, v in value.items()} if isinstance(value, dict) else {}
        decoded, problems = decode_subkey_records(records, expected, owner_of=peer_id_of_subkey)
        if problems:
            self.bad_records += len(problems)
            logger.debug("skipped %d bad %s record(s): %s", len(problems), expected.__name__, problems[:3])
        if self.admission is not None and expected is not PeerAdvert:
            decoded = {p: r for p, r in decoded.items() if self.admission.owner_admitted(p)}
        return decoded

    async def get_adverts(self) -> dict[str, PeerAdvert]:
        adverts = await self._subkeys(ids.peers_key(self.run), PeerAdvert)
        if self.admission is None:
            return adverts
        members = {p: a for p, a in adverts.items() if self.admission.advert_admitted(a)}
        self.non_members += len(adverts) - len(members)
        self.admission.members = frozenset(members)
        return members

    async def advertised_maddrs(self, peer: str) -> list[str]:
        """The addresses `peer`'s current advert gives ([] without one)."""
        advert = (await self.get_adverts()).get(peer)
        return list(advert.maddrs) if advert is not None else []

    async def get_roster(self) -> Roster | None:
        """The newest roster signed by the organiser key (when one is known); kept in `admission`."""
        if self.admission is None or not self.admission.organiser_key:
            return None
        opened = open_signed(dht_values(await self._get(ids.roster_key(self.run))), "roster", Roster,
                             self.admission.organiser_key, rank=lambda r: r.version)
        self.bad_records += opened.refused
        self.admission.set_roster(opened.message)
        return self.admission.roster

    async def get_links(self) -> dict[str, LinkReport]:
        return await self._subkeys(ids.links_key(self.run), LinkReport)

    async def get_progress(self) -> dict[str, ProgressRecord]:
        """Each origin's recent iteration reports, by peer id."""
        return await self._subkeys(ids.progress_key(self.run), ProgressRecord)
