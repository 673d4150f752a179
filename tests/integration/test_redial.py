"""A peer that moved (peer/transport/redial.py), over real hivemind P2P: two daemons in this
process. The peer we talked to comes back under the same identity on another port, as a relayed
peer does on another relay: p2pd only knows the old address and cannot dial it; handed the
addresses the peer advertises now, the request goes through."""
import pytest

from peer.transport.base import TransportError
from peer.transport.hivemind_p2p import HivemindTransport
from peer.transport.redial import Redialer, daemon_maddrs

pytestmark = pytest.mark.timeout(60)
LOCAL = ["/ip4/127.0.0.1/tcp/0"]


async def echo(remote: str, recv) -> bytes:
    return b"echo:" + await recv()


async def serving(identity: str):
    from hivemind.p2p import P2P
    p2p = await P2P.create(identity_path=identity, host_maddrs=LOCAL)
    await HivemindTransport(p2p).serve(echo)
    return p2p, [str(m) for m in await p2p.get_visible_maddrs()]


async def test_a_peer_back_on_another_address_is_reached_by_its_advert(tmp_path):
    from hivemind.p2p import P2P
    identity = str(tmp_path / "moving.key")
    first, old = await serving(identity)
    us = await P2P.create(host_maddrs=LOCAL, initial_peers=old)
    moved = None
    try:
        transport = HivemindTransport(us)
        peer = first.peer_id.to_base58()
        assert await transport.request(peer, [b"a"], timeout=10) == b"echo:a"
        await first.shutdown()
        moved, new = await serving(identity)
        assert moved.peer_id.to_base58() == peer and set(new).isdisjoint(old)

        with pytest.raises(TransportError, match="failed to dial"):   # p2pd knows the old address only
            await transport.request(peer, [b"b"], timeout=10)
        asked = []

        async def advertised(who: str) -> list[str]:
            asked.append(who)
            return new
        transport.redial = Redialer(us, advertised)
        assert await transport.request(peer, [b"c"], timeout=10) == b"echo:c"
        assert asked == [peer]
        assert await transport.request(peer, [b"d"], timeout=10) == b"echo:d"   # connected now
        assert asked == [peer]
    finally:
        for p2p in (us, moved):
            if p2p is not None:
                await p2p.shutdown()


async def test_an_advert_naming_only_the_failed_address_adds_no_dial_and_is_read_every_two_seconds(tmp_path):
    """A dead peer: its advert (until it expires) names the address that just failed, so its
    failure is as quick as without the redial, and a burst of failures reads the DHT once."""
    from hivemind.p2p import P2P
    first, old = await serving(str(tmp_path / "gone.key"))
    us = await P2P.create(host_maddrs=LOCAL, initial_peers=old)
    try:
        peer = first.peer_id.to_base58()
        await first.shutdown()
        asked = []

        async def advertised(who: str) -> list[str]:
            asked.append(who)
            return old
        redialer = Redialer(us, advertised)
        connects = []
        us._client.connect = lambda *args: connects.append(args)    # must not be reached
        transport = HivemindTransport(us)
        transport.redial = redialer
        for _ in range(2):
            with pytest.raises(TransportError, match="failed to dial"):
                await transport.request(peer, [b"x"], timeout=10)
        assert asked == [peer] and connects == []
    finally:
        await us.shutdown()


def test_addresses_for_the_daemon_drop_the_peers_own_id_and_keep_a_relays():
    me = "QmVFEfPpwP3iRjL627j8tRSpDwDFDEJJsVnynC8xZ59PUR"
    relay = "12D3KooWNdPDJHr2f9os8txV5BCEvhQtmjgqyYMjvz9DRmAXJZPg"
    got = daemon_maddrs(me, [f"/ip4/11.0.0.1/tcp/4000/p2p/{relay}/p2p-circuit/p2p/{me}",
                             f"/ip4/10.0.0.2/tcp/5000/p2p/{me}", "/ip4/10.0.0.2/tcp/5000", "not an address",
                             "/ip4/300.1.1.1/tcp/1"])
    assert [str(m) for m in got] == [f"/ip4/11.0.0.1/tcp/4000/p2p/{relay}/p2p-circuit", "/ip4/10.0.0.2/tcp/5000",
                                     "/ip4/10.0.0.2/tcp/5000"]
