"""Admission per volunteer over real hivemind DHT nodes on 127.0.0.1 (issue 24): an invited
peer writes its records; a second identity using the same invitation, an uninvited process and
a banned member cannot store any record of the run at the honest nodes (their stores are
refused there, not merely filtered when read), and readers leave them out."""
import asyncio
import functools
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from opsweb.dht_process import safe_for_large_calls

from coordinator.dht_io import CoordinatorRecords
from coordinator.members import MemberFile, admission_for
from coordinator.organiser_key import load_or_create_organiser_key
from peer.app import start_dht
from peer.config import PeerConfig
from peer.security.guard import PeerGuard
from protocol import codec, ids
from protocol.adverts import PeerAdvert, PeerState
from protocol.messages import ProgressRecord
from protocol.invitations import Roster
from protocol.owner import peer_id_of_subkey
from protocol.signing import sign
from swarmcore.dht.validators import record_validators

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "inv"


async def _stored_owners(key: str, _dht, node) -> list[str]:
    """The owners of `key`'s subkeys in this node's own storage (what it accepted)."""
    found = node.protocol.storage.get(DHTID.generate(source=key))
    if found is None or not isinstance(found.value, DictionaryDHTValue):
        return []
    owners = []
    for subkey, _ in found.value.items():
        try:
            owners.append(peer_id_of_subkey(subkey))
        except Exception:
            owners.append("unowned")
    return owners


async def stored(dht, key: str) -> set[str]:
    return set(await dht.run_coroutine(functools.partial(_stored_owners, key), return_future=True))


def advert(guard) -> PeerAdvert:
    return guard.sign_advert(PeerAdvert(guard.identity.peer_id, PeerState.ONLINE, "cpu", 1, 0.01,
                                        timestamp=time.time()))


def progress(peer: str) -> ProgressRecord:
    return ProgressRecord(peer_id=peer, reports=())


class Run:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.organiser, _ = load_or_create_organiser_key(tmp_path / "org.pem")
        self.file = MemberFile(tmp_path / "members.json", RUN)
        self.rules, self.book = admission_for(RUN, None, str(self.file.path), self.organiser)
        signer, validators = record_validators(RUN, admission=self.rules)
        self.coordinator = safe_for_large_calls(DHT(start=True, host_maddrs=LOOPBACK, record_validators=validators))
        self.maddrs = [str(a) for a in self.coordinator.get_visible_maddrs()]
        self.records = CoordinatorRecords(self.coordinator, RUN, None, self.organiser, signer.local_public_key,
                                          self.rules)
        self.dhts, self.guards = [self.coordinator], []

    def peer(self, name: str, token: str = ""):
        config = PeerConfig(initial_peers=tuple(self.maddrs), run=RUN, host_maddrs=tuple(LOOPBACK),
                            identity_path=self.tmp / f"{name}.key", invite=token)
        guard = PeerGuard(config)
        dht = start_dht(config, guard)
        self.dhts.append(dht)
        self.guards.append(guard)
        records = guard.records(dht, guard.identity.peer_id)
        guard.rpc_server(records, lambda **kw: None)      # builds the member gate (refresh = push rules)
        return guard, records

    async def round(self):
        return await self.book.round(self.records, await self.records.get_adverts())

    def close(self):
        for dht in self.dhts:
            dht.shutdown()
        for guard in self.guards:
            guard.close()


def test_only_invited_unbanned_first_identities_write_the_runs_records(tmp_path):
    run = Run(tmp_path)
    try:
        async def scenario():
            _, alice_token = run.file.invite(run.organiser, "alice")
            _, dave_token = run.file.invite(run.organiser, "dave")
            alice, alice_rec = run.peer("alice", alice_token)
            dave, dave_rec = run.peer("dave", dave_token)
            assert await alice_rec.put_advert(advert(alice), ttl_s=60)
            assert await dave_rec.put_advert(advert(dave), ttl_s=60)
            assert set(await run.round()) == {alice.identity.peer_id, dave.identity.peer_id}   # both bound now
            copy, copy_rec = run.peer("alice-copy", alice_token)        # the token's second identity
            stranger, stranger_rec = run.peer("stranger")               # no invitation at all
            run.file.ban(dave.identity.peer_id)
            assert set(await run.round()) == {alice.identity.peer_id}
            for guard in (alice, dave, copy):
                await guard.gate.refresh()                              # roster read, rules pushed
            assert alice.member_rules.roster.banned == (dave.identity.peer_id,)
            for guard, records in ((alice, alice_rec), (dave, dave_rec), (copy, copy_rec), (stranger, stranger_rec)):
                await records.put_advert(advert(guard), ttl_s=60)
                await records.put_progress(progress(guard.identity.peer_id), ttl_s=60)
            honest = {alice.identity.peer_id}
            for dht in (run.coordinator, run.dhts[1]):                  # the coordinator's and alice's nodes
                for key in (ids.peers_key(RUN), ids.progress_key(RUN)):
                    assert await stored(dht, key) <= honest, key
            assert honest <= await stored(run.coordinator, ids.progress_key(RUN))   # the rule lets members in
            assert set(await run.round()) == honest
            assert set(await run.records.get_progress()) == honest
            assert set(await alice_rec.get_adverts()) == honest
            # a newer roster signed by another key (binding alice's invitation to her copy, no bans),
            # stored for alice under the rogue's own subkey: alice keeps the organiser's
            rogue = safe_for_large_calls(DHT(start=True, host_maddrs=LOOPBACK, initial_peers=run.maddrs))
            run.dhts.append(rogue)
            invite_id = alice.invitation.invite_id
            forged = Roster(RUN, 2**62, ((invite_id, copy.identity.peer_id),))
            await rogue.store(ids.roster_key(RUN), codec.encode(sign("roster", codec.encode(forged),
                                                                     Ed25519PrivateKey.generate())),
                              time.time() + 600, subkey=RSASignatureValidator(RSAPrivateKey()).local_public_key,
                              return_future=True)
            await alice.gate.refresh()
            assert alice.member_rules.roster.banned == (dave.identity.peer_id,)
            assert set(await alice_rec.get_adverts()) == honest
        asyncio.run(scenario())
    finally:
        run.close()
