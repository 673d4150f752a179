"""DHT record validators for one run, installed in every member's DHT node: every peer's and
the coordinator's, so no node of the run stores what the others would refuse.

- hivemind's RSASignatureValidator: a subkey `[owner:<key>]` changes only with that key's
  signature, so a peer can write only its own subkey.
- hivemind's SchemaValidator: the per-peer keys (peers, links, progress) and the coordinator's
  (spec, schedule) accept only owned subkeys and bounded byte values, so nobody can add an
  unsigned subkey beside them nor replace the whole dictionary with a plain value.
- ExpiryBound: no record may expire more than 2 h ahead (a forged record cannot outlive the
  honest refreshes for a month).
- MemberAdvertValidator (only with a join key): an advert without a valid member proof is
  refused at store time, so non-members cannot write adverts into members' nodes.
Readers still check every record (swarmcore.dht.subkey_records), since a stranger's own node stores anything.

Signature checks are cached (CachedSignatureValidator): every read of a key validates each
record of every node that answers, and parsing the key and verifying the signature was most of
a peer's DHT process CPU in a local swarm.
"""
import collections
from typing import Dict, Optional

import pydantic.v1 as pydantic
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey

from swarmcore.dht.expiry import ExpiryBound
from protocol import codec, ids
from protocol.adverts import PeerAdvert
from protocol.errors import ProtocolError
from protocol.membership import is_member
from protocol.owner import BadOwnerKey, peer_id_of_subkey

MAX_RECORD_BYTES = 64 * 1024
MAX_CONTROL_RECORD_BYTES = 4 * 1024 * 1024      # a schedule of a few hundred nodes; the codec's frame limit
SIGNATURE_CACHE_ENTRIES = 4096


class CachedSignatureValidator(RSASignatureValidator):
    """RSASignatureValidator that remembers its verdicts (bounded, least recently used first
    out). A verdict depends only on the record's bytes (the owner key is in its key or subkey,
    the signature in its value), so the same record always gets the same answer."""

    def __init__(self, private_key: RSAPrivateKey | None = None, entries: int = SIGNATURE_CACHE_ENTRIES):
        super().__init__(private_key)
        self.entries = entries
        self._verdicts: collections.OrderedDict[DHTRecord, bool] = collections.OrderedDict()

    def validate(self, record: DHTRecord) -> bool:
        verdict = self._verdicts.get(record)
        if verdict is None:
            verdict = super().validate(record)
            self._verdicts[record] = verdict
            if len(self._verdicts) > self.entries:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(record)
        return verdict


def per_peer_keys(run: str) -> tuple[str, ...]:
    return ids.peers_key(run), ids.links_key(run), ids.progress_key(run), ids.spot_checks_key(run)


def control_keys(run: str) -> tuple[str, ...]:
    """The coordinator's keys: the run spec and the schedules, under its own owned subkey."""
    return ids.spec_key(run), ids.schedule_key(run)


def record_schema(run: str) -> type:
    value = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_RECORD_BYTES)]]
    control = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_CONTROL_RECORD_BYTES)]]
    fields = {k: (value, None) for k in per_peer_keys(run)} | {k: (control, None) for k in control_keys(run)}
    return pydantic.create_model(f"SkipPipeRecords_{run}", **fields)


class MemberAdvertValidator(RecordValidatorBase):
    """Accepts an advert only from its owner key's peer id with a valid join-key proof."""

    def __init__(self, run: str, join_key: bytes):
        self.run, self.join_key = run, join_key
        self.key_id = DHTID.generate(source=ids.peers_key(run)).to_bytes()

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self.key_id:
            return True
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
            advert = codec.decode(DHTProtocol.serializer.loads(record.value), expected=PeerAdvert)
            return (advert.peer_id == peer_id_of_subkey(subkey)
                    and is_member(self.join_key, self.run, advert.peer_id, advert.member_proof))
        except (ProtocolError, BadOwnerKey, ValueError, TypeError):
            return False

    @property
    def priority(self) -> int:
        return 0  # after the signature validator has checked and stripped the signature

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


def record_validators(run: str, private_key: RSAPrivateKey | None = None,
                      join_key: bytes | None = None) -> tuple[RSASignatureValidator, list[RecordValidatorBase]]:
    """(the signer, every validator for DHT(record_validators=...)). Without `private_key` the
    signer has a fresh key: enough for a node that writes no owned subkey (the coordinator)."""
    signer = CachedSignatureValidator(private_key)
    validators: list[RecordValidatorBase] = [signer, SchemaValidator(record_schema(run), allow_extra_keys=True),
                                             ExpiryBound()]
    if join_key is not None:
        validators.append(MemberAdvertValidator(run, join_key))
    return signer, validators
