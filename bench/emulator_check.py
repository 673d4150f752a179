"""The application-level link emulator on the transfers bench/multihost.py also makes over a
kernel-capped link: two P2P daemons on 127.0.0.1, the requester's transport wrapped in
peer/transport/emulator.py with the cap as both directions' bandwidth and no added latency."""
from hivemind.p2p import P2P

from protocol import messages as m
from protocol.errors import ErrorCode

from bench.netns_probe import timed_sends
from peer.transport.emulator import EmulatedTransport
from peer.transport.hivemind_p2p import HivemindTransport
from peer.transport.rpc import RpcClient, RpcServer


async def emulated_times(sizes, bandwidth_bytes_s: float) -> dict[int, float]:
    server_p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    client_p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                  initial_peers=[str(a) for a in await server_p2p.get_visible_maddrs()])
    try:
        server = RpcServer()

        async def on_ping(remote, req):
            return m.Pong(req.nonce, req.payload)

        async def on_forward(remote, req):       # as a peer answers a run it does not serve
            return m.ErrorReply(ErrorCode.UNKNOWN_RUN, "no such run")
        server.register(m.Ping, on_ping)
        server.register(m.ForwardRequest, on_forward)
        await HivemindTransport(server_p2p).serve(server.handle)
        target = server_p2p.peer_id.to_base58()
        link = ((0.0, bandwidth_bytes_s), (0.0, bandwidth_bytes_s))
        transport = EmulatedTransport(HivemindTransport(client_p2p), lambda peer: link if peer == target else None)
        return await timed_sends(RpcClient(transport), target, list(sizes))
    finally:
        await client_p2p.shutdown()
        await server_p2p.shutdown()
