"""Measures round-trip time and bandwidth to other peers with Ping/Pong, for the planner.

RTT: the fastest of a few empty pings. Bandwidth: a ping carrying `probe_bytes` each way,
minus the RTT; the fastest of `transfers` such probes, because on a busy machine every delay
(scheduling, a GC pause) only ever makes a probe slower, never faster, than the link.
Bounded: a fixed number of probes per peer, each with a timeout.
"""
import logging
import random
import time

from protocol.adverts import LinkMeasurement
from protocol.messages import Ping, Pong

from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

logger = logging.getLogger(__name__)


async def measure_link(rpc: RpcClient, peer: str, probe_bytes: int = 1 << 20, pings: int = 3,
                       timeout: float = 10.0, transfers: int = 3) -> LinkMeasurement | None:
    try:
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await rpc.call(peer, Ping(random.getrandbits(31)), timeout)
            rtts.append(time.perf_counter() - t0)
        rtt = min(rtts)
        elapsed = []
        for _ in range(max(1, transfers)):
            t0 = time.perf_counter()
            reply = await rpc.call(peer, Ping(1, bytes(probe_bytes)), timeout)
            elapsed.append(time.perf_counter() - t0)
            if not isinstance(reply, Pong) or len(reply.payload) != probe_bytes:
                return None
    except (TransportError, RemoteError) as exc:
        logger.info("link probe to %s failed: %s", peer[:12], exc)
        return None
    elapsed = min(elapsed)
    transfer = max(elapsed - rtt, 1e-6)
    return LinkMeasurement(peer, rtt_ms=rtt * 1000.0, bandwidth_bytes_s=2 * probe_bytes / transfer)
