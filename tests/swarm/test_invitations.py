"""Admission per volunteer over real hivemind DHT nodes on 127.0.0.1 (issue 24): an invited
peer writes its records; a second identity using the same invitation, an uninvited process and
a banned member cannot store any record of the run at the honest nodes (their stores are
refused there, not merely filtered when read), and readers leave them out."""
import asyncio
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey
from opsweb.dht_process import safe_for_large_calls

from protocol import codec, ids
from protocol import messages as m
from protocol.messages import ProgressRecord
from protocol.invitations import Roster
from protocol.signing import sign
from bench.support.byzantine_attacks import LOOPBACK, RUN, PrivateRun, advert_of, stored_owners

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def progress(peer: str) -> ProgressRecord:
    return ProgressRecord(peer_id=peer, reports=())


class Run(PrivateRun):
    """bench/byzantine.py's private run (a coordinator node with a member file), for this test."""

    def __init__(self, tmp_path):
        super().__init__(tmp_path, m.RunSpec(run=RUN, model="tiny", num_stages=2, skip_ratio=0.0,
                                             microbatch_samples=2, seq_len=8))

    def peer(self, name: str, token: str = ""):
        guard, records, _ = self.member(name, token)
        return guard, records


def test_only_invited_unbanned_first_identities_write_the_runs_records(tmp_path):
    run = Run(tmp_path)
    try:
        async def scenario():
            _, alice_token = run.file.invite(run.organiser, "alice")
            _, dave_token = run.file.invite(run.organiser, "dave")
            alice, alice_rec = run.peer("alice", alice_token)
            dave, dave_rec = run.peer("dave", dave_token)
            assert await alice_rec.put_advert(advert_of(alice), ttl_s=60)
            assert await dave_rec.put_advert(advert_of(dave), ttl_s=60)
            assert set(await run.round()) == {alice.identity.peer_id, dave.identity.peer_id}   # both bound now
            copy, copy_rec = run.peer("alice-copy", alice_token)        # the token's second identity
            stranger, stranger_rec = run.peer("stranger")               # no invitation at all
            run.file.ban(dave.identity.peer_id)
            assert set(await run.round()) == {alice.identity.peer_id}
            for guard in (alice, dave, copy):
                await guard.gate.refresh()                              # roster read, rules pushed
            assert alice.member_rules.roster.banned == (dave.identity.peer_id,)
            for guard, records in ((alice, alice_rec), (dave, dave_rec), (copy, copy_rec), (stranger, stranger_rec)):
                await records.put_advert(advert_of(guard), ttl_s=60)
                await records.put_progress(progress(guard.identity.peer_id), ttl_s=60)
            honest = {alice.identity.peer_id}
            for dht in (run.coordinator, run.dhts[1]):                  # the coordinator's and alice's nodes
                for key in (ids.peers_key(RUN), ids.progress_key(RUN)):
                    assert await stored_owners(dht, key) <= honest, key
            assert honest <= await stored_owners(run.coordinator, ids.progress_key(RUN))   # the rule lets members in
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
