"""CachedSignatureValidator: the same verdicts as hivemind's RSASignatureValidator, each record
verified once."""
import dataclasses

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey

from swarmcore.dht.validators import CachedSignatureValidator, record_validators


def signed_record(signer: RSASignatureValidator, value: bytes = b"advert") -> DHTRecord:
    record = DHTRecord(b"peers-key", signer.local_public_key, value, 1e10)
    return dataclasses.replace(record, value=signer.sign_value(record))


def test_verdicts_match_and_repeats_are_not_verified_again(monkeypatch):
    owner = RSASignatureValidator(RSAPrivateKey())
    cached = CachedSignatureValidator(RSAPrivateKey())
    good = signed_record(owner)
    forged = dataclasses.replace(good, value=good.value.replace(b"advert", b"advers"))
    unsigned = DHTRecord(b"peers-key", owner.local_public_key, b"advert", 1e10)
    calls = []
    real = RSASignatureValidator.validate
    monkeypatch.setattr(RSASignatureValidator, "validate", lambda self, r: calls.append(r) or real(self, r))
    for _ in range(3):
        assert cached.validate(good) is True
        assert cached.validate(forged) is False
        assert cached.validate(unsigned) is False
    assert len(calls) == 3                    # one real check per distinct record


def test_the_cache_is_bounded_and_keeps_recent_records():
    owner = RSASignatureValidator(RSAPrivateKey())
    cached = CachedSignatureValidator(RSAPrivateKey(), entries=4)
    records = [signed_record(owner, f"v{i}".encode()) for i in range(10)]
    for r in records:
        assert cached.validate(r)
        assert cached.validate(records[0])    # used again and again: never evicted
    assert len(cached._verdicts) == 4 and records[0] in cached._verdicts


def test_peers_install_the_cached_validator():
    signer, validators = record_validators("run", RSAPrivateKey(), None)
    assert isinstance(signer, CachedSignatureValidator) and signer in validators


def test_the_coordinator_installs_the_same_validators_as_the_peers():
    """coordinator/app.py calls record_validators(run, join_key=...) with no key of its own: the
    signature cache, and with a join key the member rule, as on every peer's node."""
    from swarmcore.dht.validators import MemberValidator
    signer, validators = record_validators("run", join_key=b"secret")
    assert isinstance(signer, CachedSignatureValidator) and signer in validators
    assert any(isinstance(v, MemberValidator) for v in validators)
    peer_kinds = [type(v) for v in record_validators("run", RSAPrivateKey(), b"secret")[1]]
    assert [type(v) for v in validators] == peer_kinds
    assert not any(isinstance(v, MemberValidator) for v in record_validators("run")[1])


def test_schema_verdicts_match_hiveminds_and_repeats_are_not_checked_again(monkeypatch):
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.schema import SchemaValidator

    from protocol import ids
    from swarmcore.dht.validators import MAX_RECORD_BYTES, CachedSchemaValidator, record_schema

    owner = RSASignatureValidator(RSAPrivateKey())
    key = DHTID.generate(source=ids.peers_key("run")).to_bytes()
    dumps = DHTProtocol.serializer.dumps
    good = DHTRecord(key, dumps(owner.local_public_key), dumps(b"advert"), 1e10)
    oversized = DHTRecord(key, dumps(owner.local_public_key), dumps(b"x" * (MAX_RECORD_BYTES + 1)), 1e10)
    unowned = DHTRecord(key, dumps(b"anyone"), dumps(b"advert"), 1e10)
    plain = SchemaValidator(record_schema("run"), allow_extra_keys=True)
    cached = CachedSchemaValidator(record_schema("run"), allow_extra_keys=True)
    calls = []
    real = SchemaValidator.validate
    monkeypatch.setattr(SchemaValidator, "validate", lambda self, r: calls.append(r) or real(self, r))
    for _ in range(3):
        for record in (good, oversized, unowned):
            assert cached.validate(record) == plain.validate(record)
    assert [plain.validate(r) for r in (good, oversized, unowned)] == [True, False, False]
    assert len(calls) == 3 + 3 * 3 + 3       # the cached one checked each record once
    assert cached.merge_with(SchemaValidator(record_schema("other"))) and not cached._verdicts
    assert isinstance(record_validators("run")[1][1], CachedSchemaValidator)
