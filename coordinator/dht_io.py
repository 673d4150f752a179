"""The coordinator's side of the DHT schema: write the spec and schedule, read adverts,
links and progress. Awaits hivemind's futures (never blocks the loop), bounded by timeouts;
malformed or forged records are skipped and counted."""
import asyncio
import logging
import time
from typing import Any

from hivemind import DHT

from protocol import codec, ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.errors import ProtocolError
from protocol.messages import ProgressRecord, RunSpec
from protocol.records import decode_subkey_records
from protocol.schedule import Schedule

logger = logging.getLogger(__name__)
DHT_TIMEOUT_S = 10.0
SPEC_TTL_S = 3600.0
SCHEDULE_TTL_S = 3600.0


class CoordinatorRecords:
    def __init__(self, dht: DHT, run: str):
        self.dht = dht
        self.run = run
        self.bad_records = 0

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
        decoded, problems = decode_subkey_records(records, expected)
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
        return await self._subkeys(ids.peers_key(self.run), PeerAdvert)

    async def get_links(self) -> dict[str, LinkReport]:
        return await self._subkeys(ids.links_key(self.run), LinkReport)

    async def get_progress(self) -> dict[str, ProgressRecord]:
        return await self._subkeys(ids.progress_key(self.run), ProgressRecord)
