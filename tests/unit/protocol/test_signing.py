"""The organiser's signature on the spec and schedules (protocol/signing.py), attacked the way
an outsider or a member with DHT access would: another key, altered bytes, a swapped signer,
a spec replayed as a schedule, a mangled pinned key."""
import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import codec
from protocol.errors import FieldError, ProtocolError
from protocol.messages import RunSpec
from protocol.schedule import Schedule, StageAssignment
from protocol.signing import (KEY_PREFIX, SignatureError, SignedRecord, parse_public_key, public_key_text, sign,
                              split_run_address, verify)
from swarmcore.dht.signed_records import open_signed

# fixed keys: test ids (parametrised below) must be the same in every pytest-xdist worker
ORGANISER, MALLORY = (Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32) for seed in (1, 2))
PINNED = public_key_text(ORGANISER)
SPEC = RunSpec("run-1", "tiny", 3, 1 / 3, learning_rate=3e-3)


def signed_spec(key=ORGANISER, spec=SPEC) -> SignedRecord:
    # through the wire codec both ways, as a peer reads it from the DHT
    return codec.decode(codec.encode(sign("spec", codec.encode(spec), key)), expected=SignedRecord)


def test_the_organisers_record_opens_under_the_pinned_key():
    payload = verify(signed_spec(), PINNED, "spec")
    assert codec.decode(payload, expected=RunSpec) == SPEC


def test_a_record_signed_by_another_key_is_refused():
    with pytest.raises(SignatureError, match="not by the run's organiser key"):
        verify(signed_spec(MALLORY), PINNED, "spec")


def test_a_forger_who_names_the_organiser_as_signer_is_refused():
    forged = dataclasses.replace(signed_spec(MALLORY), signer=PINNED)
    with pytest.raises(SignatureError, match="does not match"):
        verify(forged, PINNED, "spec")


def test_altered_payload_or_signature_is_refused():
    record = signed_spec()
    evil = codec.encode(dataclasses.replace(SPEC, learning_rate=0.9))
    with pytest.raises(SignatureError):
        verify(dataclasses.replace(record, payload=evil), PINNED, "spec")
    flipped = bytes([record.signature[0] ^ 1]) + record.signature[1:]
    with pytest.raises(SignatureError):
        verify(dataclasses.replace(record, signature=flipped), PINNED, "spec")


def test_a_signed_spec_cannot_be_replayed_as_a_schedule():
    record = signed_spec()
    with pytest.raises(SignatureError, match="expected a signed schedule"):
        verify(record, PINNED, "schedule")
    relabelled = dataclasses.replace(record, kind="schedule")     # the signature covers the kind
    with pytest.raises(SignatureError, match="does not match"):
        verify(relabelled, PINNED, "schedule")


@pytest.mark.parametrize("text", ["", "ed25519", "rsa:AAAA", KEY_PREFIX + "!!!", KEY_PREFIX + "AAAA",
                                  PINNED + "A", PINNED[:-1] + ("B" if PINNED[-1] != "B" else "C") + "=", None, 5])
def test_malformed_keys_are_field_errors(text):
    with pytest.raises(FieldError):
        parse_public_key(text)


def test_malformed_records_are_protocol_errors():
    record = signed_spec()
    for change in ({"signature": b"short"}, {"signer": "nobody"}, {"kind": "advert"}):
        with pytest.raises(ProtocolError):
            dataclasses.replace(record, **change)


def test_run_address_carries_the_key():
    assert split_run_address("demo") == ("demo", None)
    assert split_run_address(f"demo@{PINNED}") == ("demo", PINNED)
    with pytest.raises(FieldError):
        split_run_address("demo@ed25519:nope")


def schedule(epoch: int) -> Schedule:
    return Schedule("run-1", epoch, "full", 1, 0.0, (StageAssignment("a", 0),), ())


def signed(kind, message, key=ORGANISER) -> bytes:
    return codec.encode(sign(kind, codec.encode(message), key))


def test_a_forged_newer_epoch_is_passed_over_for_the_organisers():
    # the red team's attack: an outsider stores epoch 1002 beside the organiser's epoch 2
    values = [signed("schedule", schedule(2)), signed("schedule", schedule(1002), MALLORY), b"junk",
              signed("spec", SPEC)]
    opened = open_signed(values, "schedule", Schedule, PINNED, rank=lambda s: s.epoch)
    assert opened.message.epoch == 2 and opened.signer == PINNED and opened.refused == 3


def test_the_newest_epoch_of_the_organiser_wins():
    values = [signed("schedule", schedule(e)) for e in (3, 7, 5)]
    assert open_signed(values, "schedule", Schedule, PINNED, rank=lambda s: s.epoch).message.epoch == 7


def test_unpinned_readers_trust_one_key_but_never_two():
    alone = open_signed([signed("spec", SPEC)], "spec", RunSpec, None)
    assert alone.message == SPEC and alone.signer == PINNED          # the caller pins this key now
    both = open_signed([signed("spec", SPEC), signed("spec", SPEC, MALLORY)], "spec", RunSpec, None)
    assert both.message is None and "--run NAME@KEY" in both.problem
    # an unsigned (pre-1.4) spec is not a signed record: refused, not trusted
    assert open_signed([codec.encode(SPEC)], "spec", RunSpec, None).message is None


def test_a_record_read_again_is_not_verified_again_and_a_key_change_is_not_served_from_memory(monkeypatch):
    import swarmcore.dht.signed_records as signed_records
    calls = []
    real_verify = signed_records.verify
    monkeypatch.setattr(signed_records, "verify", lambda *a: calls.append(a) or real_verify(*a))
    value = signed("schedule", schedule(11))
    for _ in range(3):   # a peer's schedule polls: one signature check
        assert open_signed([value], "schedule", Schedule, PINNED).message.epoch == 11
    assert len(calls) == 1
    # the same bytes under another pinned key are refused, not answered from what was opened
    assert open_signed([value], "schedule", Schedule, public_key_text(MALLORY)).refused == 1
    # one flipped byte of the signature: checked afresh, and refused
    record = codec.decode(value, expected=SignedRecord)
    flipped = dataclasses.replace(record, signature=bytes([record.signature[0] ^ 1]) + record.signature[1:])
    assert open_signed([codec.encode(flipped)], "schedule", Schedule, PINNED).refused == 1


def test_values_that_are_not_bytes_are_refused_not_raised():
    # a DHT value is any msgpack value a stranger stored: an int, a list, a map
    values = [7, ["a"], {"b": 1}, None, signed("schedule", schedule(3))]
    opened = open_signed(values, "schedule", Schedule, PINNED)
    assert opened.message.epoch == 3 and opened.refused == 4
