"""The coordinator's side of the DHT schema: it writes the spec and the schedule, signed with
the organiser key and stored under its own owned subkey, and reads what the peers write
(adverts, links, progress, spot checks) through the shared record layer (swarmcore/dht)."""
import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT

from protocol import codec, ids
from protocol.invitations import Roster
from protocol.messages import RunSpec
from swarmcore.dht.subkey_records import dht_values
from protocol.schedule import Schedule
from protocol.signing import public_key_text, sign
from swarmcore.dht.signed_records import open_signed
from protocol.spot_checks import SpotCheckRecord
from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.records import RunRecords

logger = logging.getLogger(__name__)
SPEC_TTL_S = 3600.0
SCHEDULE_TTL_S = 3600.0
ROSTER_TTL_S = 3600.0


class CoordinatorRecords(RunRecords):
    """`organiser`: the key that signs the spec and schedules (peers pin its public half);
    `owner_subkey`: our DHT signer's `[owner:...]` marker, under which they are stored, so that
    nobody else can overwrite them (hivemind's RSASignatureValidator)."""

    def __init__(self, dht: DHT, run: str, join_key: bytes | None = None,
                 organiser: Ed25519PrivateKey | None = None, owner_subkey: bytes | None = None,
                 admission: AdmissionRules | None = None):
        super().__init__(dht, run, join_key, admission)
        self.organiser = organiser or Ed25519PrivateKey.generate()
        self.owner_subkey = owner_subkey

    async def put_spec(self, spec: RunSpec) -> bool:
        record = sign("spec", codec.encode(spec), self.organiser)
        return await self._store(ids.spec_key(self.run), record, SPEC_TTL_S, subkey=self.owner_subkey)

    async def put_schedule(self, schedule: Schedule, previous: Schedule | None = None,
                           superseded: Schedule | None = None) -> bool:
        """The new schedule, the one the swarm runs until it starts (`previous`) and the one
        published just before it (`superseded`, when that is another), each under its own key: a
        restarted coordinator reads the first two, a peer that finds it skipped epochs the last two."""
        if previous is not None:
            await self._store(ids.previous_schedule_key(self.run), sign("schedule", codec.encode(previous), self.organiser),
                              SCHEDULE_TTL_S, subkey=self.owner_subkey)
        if superseded is not None and superseded.epoch not in (schedule.epoch, getattr(previous, "epoch", None)):
            await self._store(ids.superseded_schedule_key(self.run),
                              sign("schedule", codec.encode(superseded), self.organiser),
                              SCHEDULE_TTL_S, subkey=self.owner_subkey)
        return await self.put_schedule_record(schedule)

    async def put_schedule_record(self, schedule: Schedule) -> bool:
        """The schedule under its own key only; written again, the same bytes (Ed25519 signs
        deterministically) land on the nodes nearest the key now."""
        record = sign("schedule", codec.encode(schedule), self.organiser)
        return await self._store(ids.schedule_key(self.run), record, SCHEDULE_TTL_S, subkey=self.owner_subkey)

    async def put_roster(self, roster: Roster) -> bool:
        record = sign("roster", codec.encode(roster), self.organiser)
        return await self._store(ids.roster_key(self.run), record, ROSTER_TTL_S, subkey=self.owner_subkey)

    async def get_schedule(self, any_signer: bool = False, previous: bool = False) -> Schedule | None:
        """The newest schedule signed with our organiser key (a restart with the same key file
        continues its epochs; anything else stored there is ignored). `any_signer`: whatever
        one key signs (tools that read a run they do not organise). `previous`: the one before it."""
        pinned = None if any_signer else public_key_text(self.organiser)
        key = ids.previous_schedule_key(self.run) if previous else ids.schedule_key(self.run)
        opened = open_signed(dht_values(await self._get(key)), "schedule", Schedule, pinned, rank=lambda s: s.epoch)
        if opened.refused:
            logger.info("ignored %d stored schedule record(s) not signed by this run's organiser key", opened.refused)
        return opened.message

    async def get_spot_checks(self) -> dict[str, SpotCheckRecord]:
        return await self._subkeys(ids.spot_checks_key(self.run), SpotCheckRecord)
