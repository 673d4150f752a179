"""Identity files, owned subkeys, join-key membership, admission limits and the member gate."""
import asyncio
import os
import stat

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import PeerID

from protocol import codec
from protocol.adverts import PeerAdvert, PeerState
from protocol.membership import JoinKeyError, create_join_key, is_member, load_join_key, member_proof
from protocol.owner import BadOwnerKey, owner_subkey, peer_id_of_subkey
from swarmcore.dht.subkey_records import decode_subkey_records

from peer.security.identity import DuplicateIdentity, IdentityError, load_identity
from peer.security.limits import Admission, Limits, Overloaded, coalesced
from peer.security.membership import MemberGate


def advert(peer_id, proof=b""):
    return PeerAdvert(peer_id=peer_id, state=PeerState.ONLINE, device="cpu", memory_free_bytes=1,
                      fwd_s_per_layer_sample=0.01, member_proof=proof)


def test_identity_file_is_private_persistent_and_locked(tmp_path):
    path = tmp_path / "keys" / "peer.key"
    first = load_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.peer_id == PeerID.from_identity(path.read_bytes()).to_base58()
    with pytest.raises(DuplicateIdentity, match="already in use by another peer on this machine"):
        load_identity(path)
    first.release()
    again = load_identity(path)  # same file, same peer id, once the first holder is gone
    assert again.peer_id == first.peer_id
    again.release()


def test_identity_refuses_unsafe_or_broken_files(tmp_path):
    path = tmp_path / "peer.key"
    load_identity(path).release()
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(path)
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"not a key")
    os.chmod(bad, 0o600)
    with pytest.raises(IdentityError, match="not a libp2p RSA private key"):
        load_identity(bad)


def test_owner_subkey_gives_the_libp2p_peer_id(tmp_path):
    identity = load_identity(tmp_path / "a.key")
    signer = RSASignatureValidator(identity.private_key)
    assert signer.local_public_key == owner_subkey(identity.private_key.get_public_key().to_bytes())
    assert peer_id_of_subkey(signer.local_public_key) == identity.peer_id
    identity.release()


@pytest.mark.parametrize("subkey", [b"QmPeer", "[owner:ssh-rsa AAAA]", b"[owner:ssh-rsa !!]",
                                    b"[owner:ssh-rsa AAAAB3NzaC1yc2E=]", b"[owner:ssh-ed25519 AAAA]", 7, None])
def test_bad_owner_subkeys_are_rejected(subkey):
    with pytest.raises(BadOwnerKey):
        peer_id_of_subkey(subkey)


def test_records_claiming_another_owner_are_dropped(tmp_path):
    a, b = load_identity(tmp_path / "a.key"), load_identity(tmp_path / "b.key")
    sub_a = RSASignatureValidator(a.private_key).local_public_key
    sub_b = RSASignatureValidator(b.private_key).local_public_key
    records = {sub_a: codec.encode(advert(a.peer_id)),
               sub_b: codec.encode(advert(a.peer_id)),      # b pretends to be a
               b"QmNoOwner": codec.encode(advert("QmNoOwner"))}
    decoded, problems = decode_subkey_records(records, PeerAdvert, owner_of=peer_id_of_subkey)
    assert list(decoded) == [a.peer_id] and len(problems) == 2
    a.release(), b.release()


def test_join_key_proofs(tmp_path):
    path = tmp_path / "join.key"
    key = create_join_key(path)
    assert load_join_key(path) == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    proof = member_proof(key, "run", "QmA")
    assert is_member(key, "run", "QmA", proof)
    assert not is_member(key, "run", "QmB", proof)           # copied proof, other peer id
    assert not is_member(key, "other", "QmA", proof)         # other run
    assert not is_member(b"x" * 32, "run", "QmA", proof)     # other key
    assert not is_member(key, "run", "QmA", b"")
    os.chmod(path, 0o640)
    with pytest.raises(JoinKeyError, match="chmod 600"):
        load_join_key(path)
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    os.chmod(short, 0o600)
    with pytest.raises(JoinKeyError, match="16-4096 bytes"):
        load_join_key(short)
    with pytest.raises(JoinKeyError, match="cannot read"):
        load_join_key(tmp_path / "missing.key")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_token_bucket_rate_limits_one_peer_only():
    clock = Clock()
    adm = Admission(Limits(rate_per_s=10, burst=5, max_in_flight=100, max_in_flight_per_peer=100), clock)
    for _ in range(5):
        adm.enter("a")
        adm.leave("a")
    with pytest.raises(Overloaded, match="requests/s"):
        adm.enter("a")
    adm.enter("b")          # another peer has its own bucket
    adm.leave("b")
    clock.t += 0.5          # 5 tokens come back
    for _ in range(5):
        adm.enter("a")
        adm.leave("a")
    assert adm.refused["rate"] == 1 and adm.total_in_flight == 0


def test_in_flight_caps_and_stream_budget():
    adm = Admission(Limits(max_in_flight=3, max_in_flight_per_peer=2, stream_bytes_budget=100, burst=100,
                           stream_bytes_per_peer=100))
    adm.enter("a"), adm.enter("a")
    with pytest.raises(Overloaded, match="of your requests"):
        adm.enter("a")
    adm.enter("b")
    with pytest.raises(Overloaded, match="in progress"):
        adm.enter("c")
    adm.reserve_stream(60)
    with pytest.raises(Overloaded, match="budget"):
        adm.reserve_stream(50)
    adm.release_stream(60)
    adm.reserve_stream(100)


def test_one_peer_gets_only_a_quarter_of_the_stream_bytes_by_default():
    adm = Admission(Limits(stream_bytes_budget=100))
    adm.reserve_stream(20, "greedy")
    with pytest.raises(Overloaded, match="your share of 25"):
        adm.reserve_stream(10, "greedy")
    for peer in ("b", "c", "d"):     # the others still get theirs
        adm.reserve_stream(25, peer)
    assert adm.peer_stream_bytes("greedy") == 20 and adm.stream_bytes == 95
    adm.release_stream(20, "greedy")
    assert adm.peer_stream_bytes("greedy") == 0 and adm.refused["peer_stream_bytes"] == 1
    adm.reserve_stream(5, "greedy")


def test_default_limits_give_one_peer_a_quarter_of_the_slots():
    lim = Limits()
    assert lim.max_in_flight_per_peer * 4 <= lim.max_in_flight


def test_bucket_table_is_bounded():
    adm = Admission(Limits(max_tracked_peers=10))
    for i in range(1000):
        adm.enter(f"p{i}")
        adm.leave(f"p{i}")
    assert len(adm._buckets) == 10 and not adm._in_flight


def test_member_gate_refreshes_at_most_once_per_interval():
    clock = Clock()
    calls = []
    members = {"m1"}

    async def list_members():
        calls.append(clock.t)
        return set(members)

    async def scenario():
        gate = MemberGate(list_members, always={"me"}, min_refresh_s=1.0, clock=clock)
        assert await gate.admit("me") and calls == []
        assert await gate.admit("m1") and len(calls) == 1        # unknown at first: one refresh
        for _ in range(50):
            assert not await gate.admit("stranger")              # no refresh storm
        assert len(calls) == 1
        members.add("m2")
        clock.t += 1.5
        assert await gate.admit("m2") and len(calls) == 2        # a new member gets in
        assert gate.refused == 50
    asyncio.run(scenario())


def test_remote_triggered_refreshes_are_coalesced_and_spaced():
    clock = Clock()
    runs = []

    async def refresh():
        runs.append(clock.t)
        await asyncio.sleep(0.01)

    async def scenario():
        wrapped = coalesced(refresh, min_interval_s=0.5, clock=clock)
        await asyncio.gather(*(wrapped() for _ in range(20)))   # one shared run
        assert len(runs) == 1
        for _ in range(20):
            await wrapped()                                     # too soon: no new run
        assert len(runs) == 1
        clock.t += 0.6
        await wrapped()
        assert len(runs) == 2
    asyncio.run(scenario())


def test_a_stream_that_sends_nothing_is_cut_but_a_slow_one_is_not():
    from peer.transport.framing import StreamIdle, read_frame
    from peer.transport.hivemind_p2p import IDLE_TIMEOUT_S, ITEM_TIMEOUT_S
    assert IDLE_TIMEOUT_S <= 5 < ITEM_TIMEOUT_S      # issue 24: idle streams held a slot for 30 s

    async def scenario():
        slow = asyncio.StreamReader()
        frame = (1000).to_bytes(4, "big") + b"x" * 1000

        async def trickle():              # 10 pieces, 0.05 s apart: slow, never idle for 0.2 s
            for i in range(0, len(frame), 100):
                slow.feed_data(frame[i:i + 100])
                await asyncio.sleep(0.05)
        feeding = asyncio.ensure_future(trickle())
        assert await read_frame(slow, idle_s=0.2) == b"x" * 1000
        await feeding
        idle = asyncio.StreamReader()
        idle.feed_data((1000).to_bytes(4, "big") + b"x" * 10)   # then silence
        with pytest.raises(StreamIdle):
            await read_frame(idle, idle_s=0.2)
    asyncio.run(scenario())


def test_an_invitation_pins_its_organiser_key_and_garbage_is_a_clear_error():
    import argparse
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from peer.cli import invited_key
    from protocol.invitations import issue
    from protocol.signing import public_key_text
    organiser = Ed25519PrivateKey.generate()
    _, token = issue(organiser, "run")
    assert invited_key(token, "") == public_key_text(organiser)
    assert invited_key("", "ed25519:pinned") == "ed25519:pinned"
    with pytest.raises(argparse.ArgumentTypeError, match="another organiser key"):
        invited_key(token, public_key_text(Ed25519PrivateKey.generate()))
    with pytest.raises(argparse.ArgumentTypeError, match="--invite: an invitation starts with"):
        invited_key("nonsense", "")
