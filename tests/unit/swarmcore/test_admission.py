"""Who is a member of a private run (swarmcore/dht/admission.py), and the DHT validator that
applies it to every per-peer record at store time."""
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord

from protocol import codec, ids
from protocol.adverts import PeerAdvert, PeerState
from protocol.invitations import Roster, issue, make_claim
from protocol.membership import member_proof
from protocol.owner import peer_id_of_subkey
from protocol.signing import public_key_text
from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.validators import MemberValidator

RUN = "adm"
ORG = Ed25519PrivateKey.generate()
JOIN = b"k" * 32


def advert(peer: str, invitation=None, join: bytes | None = None) -> PeerAdvert:
    return PeerAdvert(peer, PeerState.ONLINE, "cpu", 1, 0.01, timestamp=time.time(),
                      member_proof=member_proof(join, RUN, peer) if join else b"",
                      invite_claim=make_claim(invitation, RUN, peer) if invitation else b"")


def rules(roster: Roster | None = None, join_key: bytes | None = None) -> AdmissionRules:
    return AdmissionRules(RUN, join_key, organiser_key=public_key_text(ORG), roster=roster)


def test_an_invitation_admits_its_first_identity_only_once_bound():
    invitation, _ = issue(ORG, RUN)
    r = rules()
    assert r.advert_admitted(advert("QmA", invitation)) and r.advert_admitted(advert("QmB", invitation))
    r.set_roster(Roster(RUN, 1, ((invitation.invite_id, "QmA"),)))
    assert r.advert_admitted(advert("QmA", invitation))
    assert not r.advert_admitted(advert("QmB", invitation))     # the token's second identity
    assert not r.advert_admitted(advert("QmC"))                  # no invitation at all
    r.set_roster(Roster(RUN, 0))                                 # an older roster changes nothing
    assert not r.advert_admitted(advert("QmB", invitation))


def test_banned_and_revoked_members_are_refused_join_key_or_not():
    invitation, _ = issue(ORG, RUN)
    r = rules(join_key=JOIN)
    assert r.advert_admitted(advert("QmJ", join=JOIN)) and r.advert_admitted(advert("QmA", invitation))
    r.set_roster(Roster(RUN, 2, banned=("QmJ",), revoked=(invitation.invite_id,)))
    assert not r.advert_admitted(advert("QmJ", join=JOIN))
    assert not r.advert_admitted(advert("QmA", invitation))
    assert r.advert_admitted(advert("QmK", join=JOIN))           # the shared join key still works
    r.members = frozenset({"QmJ", "QmK"})
    assert r.owner_admitted("QmK") and not r.owner_admitted("QmJ") and not r.owner_admitted("QmX")


def test_without_the_organiser_key_no_claim_counts():
    invitation, _ = issue(ORG, RUN)
    assert not AdmissionRules(RUN).advert_admitted(advert("QmA", invitation))


class Signer:
    """An owned subkey as hivemind's RSASignatureValidator writes it."""

    def __init__(self):
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.utils.crypto import RSAPrivateKey
        self.subkey = RSASignatureValidator(RSAPrivateKey()).local_public_key   # not the process-wide key
        self.peer_id = peer_id_of_subkey(self.subkey)


def record(key: str, subkey: bytes, value) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=key).to_bytes(), DHTProtocol.serializer.dumps(subkey),
                     DHTProtocol.serializer.dumps(codec.encode(value)), time.time() + 60)


def test_the_validator_refuses_every_record_of_a_non_member():
    member, outsider = Signer(), Signer()
    invitation, _ = issue(ORG, RUN)
    validator = MemberValidator(rules())
    assert validator.validate(record(ids.peers_key(RUN), member.subkey, advert(member.peer_id, invitation)))
    assert not validator.validate(record(ids.peers_key(RUN), outsider.subkey, advert(outsider.peer_id)))
    # another id in the advert than the key that signs it
    assert not validator.validate(record(ids.peers_key(RUN), outsider.subkey, advert(member.peer_id, invitation)))
    report = advert("x")   # any value: only the owner counts for the other keys
    for key in (ids.links_key(RUN), ids.progress_key(RUN), ids.spot_checks_key(RUN)):
        assert not validator.validate(record(key, member.subkey, report))    # not seen as a member yet
        validator.rules = rules()
        validator.rules.members = frozenset({member.peer_id})
        assert validator.validate(record(key, member.subkey, report))
        assert not validator.validate(record(key, outsider.subkey, report))
        validator.rules = rules()
    assert validator.validate(record("another/key", outsider.subkey, report))    # not this run's
