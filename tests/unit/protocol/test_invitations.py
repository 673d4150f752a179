"""Invitations (protocol/invitations.py): a token admits the peer id that claims it, under the
organiser key that issued it, for its run; copies, forgeries and garbage prove nothing."""
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import codec
from protocol.invitations import (CLAIM_BYTES, InvitationError, Roster, issue, make_claim, parse_token,
                                  verify_claim)
from protocol.signing import public_key_text

ORG = Ed25519PrivateKey.generate()
KEY = public_key_text(ORG)


def test_a_token_admits_the_peer_that_claims_it():
    invitation, token = issue(ORG, "run")
    parsed = parse_token(token)
    assert parsed == invitation and parsed.organiser_key == KEY
    claim = make_claim(parsed, "run", "QmAlice")
    assert len(claim) == CLAIM_BYTES
    assert verify_claim(claim, "run", "QmAlice", KEY) == invitation.invite_id


def test_a_claim_proves_nothing_for_another_peer_run_or_key():
    invitation, _ = issue(ORG, "run")
    claim = make_claim(invitation, "run", "QmAlice")
    assert verify_claim(claim, "run", "QmMallory", KEY) is None          # copied from Alice's advert
    assert verify_claim(claim, "other", "QmAlice", KEY) is None
    assert verify_claim(claim, "run", "QmAlice", public_key_text(Ed25519PrivateKey.generate())) is None
    assert verify_claim(claim, "run", "QmAlice", "") is None


def test_a_forged_certificate_or_altered_claim_is_refused():
    mallory = Ed25519PrivateKey.generate()
    forged, _ = issue(mallory, "run")             # self-issued: certified by the wrong key
    assert verify_claim(make_claim(forged, "run", "QmM"), "run", "QmM", KEY) is None
    invitation, _ = issue(ORG, "run")
    claim = bytearray(make_claim(invitation, "run", "QmAlice"))
    for at in (0, 10, 50, 120, CLAIM_BYTES - 1):   # id, invite key, certificate, signature
        altered = bytearray(claim)
        altered[at] ^= 1
        assert verify_claim(bytes(altered), "run", "QmAlice", KEY) is None
    assert verify_claim(bytes(claim[:-1]), "run", "QmAlice", KEY) is None
    assert verify_claim("not bytes", "run", "QmAlice", KEY) is None


@pytest.mark.parametrize("token", ["", "hello", "skpinv1.", "skpinv1.!!!", "skpinv1.AAAA", None])
def test_garbage_tokens_get_a_clear_error(token):
    with pytest.raises(InvitationError, match="invitation"):
        parse_token(token)


def test_a_roster_round_trips_through_the_codec():
    roster = Roster("run", 5, (("00ff", "QmA"),), ("QmB",), ("0011",))
    assert codec.decode(codec.encode(roster), expected=Roster) == roster
