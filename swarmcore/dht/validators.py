"""DHT record validators for one run, installed in every member's DHT node: every peer's and
the coordinator's, so no node of the run stores what the others would refuse.

- hivemind's RSASignatureValidator: a subkey `[owner:<key>]` changes only with that key's
  signature, so a peer can write only its own subkey.
- hivemind's SchemaValidator: the per-peer keys (peers, links, progress) and the coordinator's
  (spec, schedule) accept only owned subkeys and bounded byte values, so nobody can add an
  unsigned subkey beside them nor replace the whole dictionary with a plain value.
- ExpiryBound: no record may expire more than 2 h ahead (a forged record cannot outlive the
  honest refreshes for a month).
- MemberValidator (private runs: a join key or invitations): an advert without a valid member
  proof or invitation claim, or of a banned peer, is refused at store time, and so are the
  other per-peer records of anyone whose advert was not admitted (swarmcore/dht/admission.py),
  so non-members cannot write any record of the run into members' nodes.
Readers still check every record (swarmcore.dht.subkey_records), since a stranger's own node stores anything.

Signature and schema checks are cached (CachedSignatureValidator, CachedSchemaValidator): every
read of a key validates each record of every node that answers, and parsing the key, verifying
the signature and then checking the schema were most of a peer's DHT process CPU in a local swarm.
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

from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.expiry import ExpiryBound
from protocol import codec, ids
from protocol.adverts import PeerAdvert
from protocol.errors import ProtocolError
from protocol.owner import BadOwnerKey, peer_id_of_subkey

MAX_RECORD_BYTES = 64 * 1024
MAX_CONTROL_RECORD_BYTES = 4 * 1024 * 1024      # a schedule of a few hundred nodes; the codec's frame limit
SIGNATURE_CACHE_ENTRIES = 4096


class _Verdicts:
    """validate()'s verdicts remembered (bounded, least recently used first out), for validators
    whose verdict depends only on the record's bytes."""

    def _init_verdicts(self, entries: int) -> None:
        self.entries = entries
        self._verdicts: collections.OrderedDict[DHTRecord, bool] = collections.OrderedDict()

    def validate(self, record: DHTRecord) -> bool:
        verdict = self._verdicts.get(record)
        if verdict is None:
            verdict = super().validate(record)     # the validator this is mixed into
            self._verdicts[record] = verdict
            if len(self._verdicts) > self.entries:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(record)
        return verdict


class CachedSignatureValidator(_Verdicts, RSASignatureValidator):
    """RSASignatureValidator that remembers its verdicts. A verdict depends only on the record's
    bytes (the owner key is in its key or subkey, the signature in its value)."""

    def __init__(self, private_key: RSAPrivateKey | None = None, entries: int = SIGNATURE_CACHE_ENTRIES):
        super().__init__(private_key)
        self._init_verdicts(entries)


class CachedSchemaValidator(_Verdicts, SchemaValidator):
    """SchemaValidator that remembers its verdicts: checking a record against the pydantic
    schema was the most of a peer's DHT process CPU after the signatures were cached. A verdict
    depends on the record and the schemas; merging in another's schemas forgets them all."""

    def __init__(self, schema: type, allow_extra_keys: bool = True, entries: int = SIGNATURE_CACHE_ENTRIES):
        super().__init__(schema, allow_extra_keys=allow_extra_keys)
        self._init_verdicts(entries)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        merged = super().merge_with(other)
        if merged:
            self._verdicts.clear()
        return merged


def per_peer_keys(run: str) -> tuple[str, ...]:
    return ids.peers_key(run), ids.links_key(run), ids.progress_key(run), ids.spot_checks_key(run)


def control_keys(run: str) -> tuple[str, ...]:
    """The coordinator's keys: the run spec, the schedules and the roster, under its own owned subkey."""
    return (ids.spec_key(run), ids.schedule_key(run), ids.previous_schedule_key(run),
            ids.superseded_schedule_key(run), ids.roster_key(run))


def record_schema(run: str) -> type:
    value = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_RECORD_BYTES)]]
    control = Optional[Dict[BytesWithPublicKey, pydantic.conbytes(strict=True, max_length=MAX_CONTROL_RECORD_BYTES)]]
    fields = {k: (value, None) for k in per_peer_keys(run)} | {k: (control, None) for k in control_keys(run)}
    return pydantic.create_model(f"SkipPipeRecords_{run}", **fields)


class MemberValidator(RecordValidatorBase):
    """In a private run (swarmcore/dht/admission.py): an advert only from its owner key's peer id
    with a valid join-key proof or invitation claim, and not banned; the owner's other per-peer
    records only once its advert was admitted. `rules` is replaced by push_rules."""

    def __init__(self, rules: AdmissionRules):
        self.run, self.rules = rules.run, rules
        self.advert_key = DHTID.generate(source=ids.peers_key(rules.run)).to_bytes()
        self.other_keys = {DHTID.generate(source=k).to_bytes() for k in per_peer_keys(rules.run)} - {self.advert_key}

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self.advert_key and record.key not in self.other_keys:
            return True
        try:
            owner = peer_id_of_subkey(DHTProtocol.serializer.loads(record.subkey))
            if record.key != self.advert_key:
                return self.rules.owner_admitted(owner)
            advert = codec.decode(DHTProtocol.serializer.loads(record.value), expected=PeerAdvert)
            return advert.peer_id == owner and self.rules.advert_admitted(advert)
        except (ProtocolError, BadOwnerKey, ValueError, TypeError):
            return False

    @property
    def priority(self) -> int:
        return 0  # after the signature validator has checked and stripped the signature

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False



def record_validators(run: str, private_key: RSAPrivateKey | None = None, join_key: bytes | None = None,
                      admission: AdmissionRules | None = None) -> tuple[RSASignatureValidator, list[RecordValidatorBase]]:
    """(the signer, every validator for DHT(record_validators=...)). Without `private_key` the
    signer has a fresh key: enough for a node that writes no owned subkey (the coordinator).
    A private run (`admission`, or a `join_key` alone) adds the MemberValidator."""
    signer = CachedSignatureValidator(private_key)
    validators: list[RecordValidatorBase] = [signer, CachedSchemaValidator(record_schema(run), allow_extra_keys=True),
                                             ExpiryBound()]
    if admission is None and join_key is not None:
        admission = AdmissionRules(run, join_key)
    if admission is not None:
        validators.append(MemberValidator(admission))
    return signer, validators
