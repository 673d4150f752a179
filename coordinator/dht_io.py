"""The coordinator's side of the DHT schema: it writes the spec and the schedule, and reads
what the peers write (adverts, links, progress, spot checks) through the shared record layer
(swarmcore/dht)."""
import logging

from protocol import codec, ids
from protocol.errors import ProtocolError
from protocol.messages import ProgressRecord, RunSpec
from protocol.schedule import Schedule
from protocol.spot_checks import SpotCheckRecord
from swarmcore.dht.records import RunRecords

logger = logging.getLogger(__name__)
SPEC_TTL_S = 3600.0
SCHEDULE_TTL_S = 3600.0


class CoordinatorRecords(RunRecords):
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

    async def get_progress(self) -> dict[str, ProgressRecord]:
        return await self._subkeys(ids.progress_key(self.run), ProgressRecord)

    async def get_spot_checks(self) -> dict[str, SpotCheckRecord]:
        return await self._subkeys(ids.spot_checks_key(self.run), SpotCheckRecord)
