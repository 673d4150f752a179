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
