"""The coordinator's side of the DHT schema: write the spec and schedule, read adverts,
links and progress. Awaits hivemind's futures (never blocks the loop), bounded by timeouts;
malformed or forged records are skipped and counted."""
import asyncio
import logging
import time
from typing import Any, Dict, Optional

import pydantic.v1 as pydantic
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator

from opsweb.dht_expiry import ExpiryBound
from protocol import codec, ids
from protocol.adverts import LinkReport, PeerAdvert
from protocol.membership import is_member
from protocol.messages import ProgressRecord, RunSpec
from protocol.owner import peer_id_of_subkey
from protocol.records import decode_subkey_records, dht_values
from protocol.schedule import Schedule
from protocol.signing import open_signed, public_key_text, sign
from protocol.spot_checks import SpotCheckRecord

logger = logging.getLogger(__name__)
DHT_TIMEOUT_S = 10.0
SPEC_TTL_S = 3600.0
SCHEDULE_TTL_S = 3600.0
MAX_RECORD_BYTES = 64 * 1024
MAX_CONTROL_RECORD_BYTES = 4 * 1024 * 1024      # a schedule of a few hundred nodes; the codec's frame limit


def record_validators(run: str) -> list:
    """The same record rules as peer/security/dht_guard.py (the coordinator may not import peer/):
    per-peer keys take only owned, signed subkeys with bounded values. The first validator
    signs our own records (its `local_public_key` is our owner subkey)."""
    value = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_RECORD_BYTES)]]
    control = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_CONTROL_RECORD_BYTES)]]
    keys = (ids.peers_key(run), ids.links_key(run), ids.progress_key(run), ids.spot_checks_key(run))
    fields = {k: (value, None) for k in keys} | {k: (control, None) for k in (ids.spec_key(run), ids.schedule_key(run))}
    schema = pydantic.create_model(f"SkipPipeRecords_{run}", **fields)
    return [RSASignatureValidator(), SchemaValidator(schema, allow_extra_keys=True), ExpiryBound()]


class CoordinatorRecords:
    """`organiser`: the key that signs the spec and schedules (peers pin its public half);
    `owner_subkey`: our DHT signer's `[owner:...]` marker, under which they are stored, so that
    nobody else can overwrite them (hivemind's RSASignatureValidator)."""

    def __init__(self, dht: DHT, run: str, join_key: bytes | None = None,
                 organiser: Ed25519PrivateKey | None = None, owner_subkey: bytes | None = None):
        self.dht = dht
        self.run = run
        self.join_key = join_key     # when set, adverts without a valid member proof are dropped
        self.organiser = organiser or Ed25519PrivateKey.generate()
        self.owner_subkey = owner_subkey
        self.bad_records = 0
        self.non_members = 0

    async def _store(self, key: str, message: Any, ttl_s: float) -> bool:
        async with asyncio.timeout(DHT_TIMEOUT_S):
            return bool(await self.dht.store(key, codec.encode(message), time.time() + ttl_s,
                                             subkey=self.owner_subkey, return_future=True))

    async def _signed_values(self, key: str) -> list[bytes]:
        return dht_values(await self._get(key))

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
        return await self._store(ids.spec_key(self.run), sign("spec", codec.encode(spec), self.organiser), SPEC_TTL_S)

    async def put_schedule(self, schedule: Schedule) -> bool:
        record = sign("schedule", codec.encode(schedule), self.organiser)
        return await self._store(ids.schedule_key(self.run), record, SCHEDULE_TTL_S)

    async def get_schedule(self, any_signer: bool = False) -> Schedule | None:
        """The newest schedule signed with our organiser key (a restart with the same key file
        continues its epochs; anything else stored there is ignored). `any_signer`: whatever
        one key signs (tools that read a run they do not organise)."""
        pinned = None if any_signer else public_key_text(self.organiser)
        opened = open_signed(await self._signed_values(ids.schedule_key(self.run)), "schedule", Schedule,
                             pinned, rank=lambda s: s.epoch)
        if opened.refused:
            logger.info("ignored %d stored schedule record(s) not signed by this run's organiser key", opened.refused)
        return opened.message

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
