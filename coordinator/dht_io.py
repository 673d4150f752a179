"""The coordinator's side of the DHT schema: write the spec and schedule, read adverts,
links and progress. Awaits hivemind's futures (never blocks the loop), bounded by timeouts;
malformed or forged records are skipped and counted."""
import asyncio
import logging
import time
from typing import Any, Dict, Optional

import pydantic.v1 as pydantic
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator

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
SPEC_TTL_S = 3600.0
SCHEDULE_TTL_S = 3600.0
MAX_RECORD_BYTES = 64 * 1024


def record_validators(run: str) -> list:
    """The same record rules as peer/security/dht_guard.py (the coordinator may not import peer/):
    per-peer keys take only owned, signed subkeys with bounded values."""
    value = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_RECORD_BYTES)]]
    keys = (ids.peers_key(run), ids.links_key(run), ids.progress_key(run), ids.spot_checks_key(run))
    schema = pydantic.create_model(f"SkipPipeRecords_{run}", **{k: (value, None) for k in keys})
    return [RSASignatureValidator(), SchemaValidator(schema, allow_extra_keys=True)]


class CoordinatorRecords:
    def __init__(self, dht: DHT, run: str, join_key: bytes | None = None):
        self.dht = dht
        self.run = run
        self.join_key = join_key     # when set, adverts without a valid member proof are dropped
        self.bad_records = 0
        self.non_members = 0

    async def _store(self, key: str, message: Any, ttl_s: float) -> bool:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            return bool(await self.dht.store(key, codec.encode(message), time.time() + ttl_s,
                                             return_future=True))

    async def _get(self, key: str) -> Any:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            found = await self.dht.get(key, latest=True, return_future=True)
        return None if found is None else found.value

    async def _subkeys(self, key: str, expected: type) -> dict[str, Any]:
        value = await self._get(key)
        records = {k: v.value for k, v in value.items()} if isinstance(value, dict) else {}
        decoded, problems = decode_subkey_records(records, expected, owner_of=peer_id_of_subkey)
        if problems:
            self.bad_records += len(problems)
            logger.debug("skipped %d bad %s record(s): %s", len(problems), expected.__name__, problems[:3])
        return decoded

    async def put_spec(self, spec: RunSpec) -> bool:
        return await self._store(ids.spec_key(self.run), spec, SPEC_TTL_S)

    async def put_schedule(self, schedule: Schedule) -> bool:
        return await self._store(ids.schedule_key(self.run), schedule, SCHEDULE_TTL_S)

    async def get_schedule(self) -> Schedule | None:
        value = await self._get(ids.schedule_key(self.run))
        if value is None:
            return None
        try:
            return codec.decode(value, expected=Schedule)
        except ProtocolError as exc:
            logger.warning("the stored schedule is unreadable (%s); starting a new epoch sequence", exc)
            return None

    async def get_adverts(self) -> dict[str, PeerAdvert]:
        adverts = await self._subkeys(ids.peers_key(self.run), PeerAdvert)
        if self.join_key is None:
            return adverts
        members = {p: a for p, a in adverts.items() if is_member(self.join_key, self.run, p, a.member_proof)}
        self.non_members += len(adverts) - len(members)
        return members

    async def get_links(self) -> dict[str, LinkReport]:
        return await self._subkeys(ids.links_key(self.run), LinkReport)

    async def get_progress(self) -> dict[str, ProgressRecord]:
        return await self._subkeys(ids.progress_key(self.run), ProgressRecord)

    async def get_spot_checks(self) -> dict[str, SpotCheckRecord]:
        return await self._subkeys(ids.spot_checks_key(self.run), SpotCheckRecord)
