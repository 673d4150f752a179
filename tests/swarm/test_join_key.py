"""A run with a join key and invitations, end to end over real P2P: a key holder and an invited
volunteer train; the invitation is bound to the volunteer's identity; a peer with neither is
neither listed nor planned, and a non-member's RPC is refused with NOT_MEMBER."""
import asyncio
import contextlib

import pytest
from hivemind import DHT

from opsweb.dht_process import safe_for_large_calls
from protocol import codec
from protocol import messages as m
from protocol.errors import ErrorCode

from coordinator.dht_io import CoordinatorRecords
from coordinator.members import MemberFile
from coordinator.organiser_key import load_or_create_organiser_key
from bench.support import rogue
from bench.support.harness import coordinator, peers, wait_for
from swarmcore.dht.validators import record_validators

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_only_key_holders_and_invited_peers_take_part(tmp_path):
    key = tmp_path / "join.key"
    organiser, _ = load_or_create_organiser_key(tmp_path / "org.pem")
    member_file = MemberFile(tmp_path / "members.json", "t")
    invite_id, token = member_file.invite(organiser, "the invited volunteer")

    async def scenario():
        async with coordinator(min_peers=2, num_stages=2, max_steps=0, join_key_path=str(key),
                               members_path=str(member_file.path), organiser_key_path=str(tmp_path / "org.pem")) as app:
            assert key.exists() and (key.stat().st_mode & 0o777) == 0o600   # created by the coordinator
            with contextlib.ExitStack() as stack:
                stack.enter_context(peers(app, tmp_path / "members", 1, "--join-key", str(key), stages=[0]))
                stack.enter_context(peers(app, tmp_path / "invited", 1, "--invite", token, stages=[1]))
                stack.enter_context(peers(app, tmp_path / "outsider", 1, stages=[0]))
                await wait_for(lambda: len(app.summaries) >= 2, 150, "two iterations by the members")
                # the coordinator's node refuses non-members' adverts (its validators hold the key):
                # a node and a reader that ignore the key still find the outsider's in the DHT
                keyless = await asyncio.to_thread(lambda: safe_for_large_calls(DHT(
                    start=True, initial_peers=app.maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                    record_validators=record_validators(app.config.run)[1])))
                stack.callback(keyless.shutdown)
                everyone = CoordinatorRecords(keyless, app.config.run)
                all_adverts = await wait_for(lambda: _at_least(everyone, 3), 30, "the outsider's advert")
                members = set(await app.records.get_adverts())
                assert set(await CoordinatorRecords(app.dht, app.config.run).get_adverts()) == members
                outsiders = set(all_adverts) - members
                assert len(members) == 2 and len(outsiders) == 1
                assert set(app.schedule.stage_of()) == members
                bound = member_file.read()["invites"][invite_id]["peer"]
                assert bound in members and app.member_book.rules.roster.bindings == ((invite_id, bound),)
                # the coordinator's own peer id is no member: a member's RPC server refuses it unread
                p2p = await app.dht.replicate_p2p()
                # (the member's gate may first refresh its member list from the DHT, which can take
                # longer than rogue's default 5 s on a loaded box: no reply then is not an answer)
                request = rogue.Request("ping", [codec.encode(m.Ping(1))])
                reply = await wait_for(lambda: rogue.send(p2p, sorted(members)[0], request, timeout=20.0), 90,
                                       "an answer from a member to the coordinator's stream")
                assert codec.decode(reply).code == ErrorCode.NOT_MEMBER
    for folder in ("members", "invited", "outsider"):
        (tmp_path / folder).mkdir()
    asyncio.run(scenario())


async def _at_least(records, n):
    adverts = await records.get_adverts()
    return adverts if len(adverts) >= n else None
