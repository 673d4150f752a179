"""Transport benchmark (issue 4): the real RPC stack over real hivemind P2P on 127.0.0.1.

Two P2P daemons in this process; one serves an RpcServer over HivemindTransport, the other
calls it with RpcClient, exactly as peers do. Measured side by side:
- per-hop overhead: round trip of a Ping (no compute, no payload) -> median / p95 ms, back to
  back and after a 50 ms pause (as hops in a pipeline come);
- payload throughput: 16 MB float32 ForwardRequests (streamed in chunks) -> MB/s;
- peer memory against its activation budget (bench/peer_memory.py): a real two-stage swarm
  with --max-activations 2 and 12 side by side -> RSS growth vs budget, and the measured cost
  of one more stashed microbatch vs the budgeted one.
Targets: overhead < 10 ms, throughput >= 200 MB/s, memory bounded by the activation budget.

  python bench/swarm.py [--pings 200] [--sends 8] [--no-memory] [--loop uvloop|asyncio]
Last line: RESULT hop_overhead_ms=<median> hop_p95_ms=<n> hop_after_pause_ms=<median> throughput_mb_s=<median>
           [rss_growth_mb=<n> activation_budget_mb=<n> runtime_overhead_mb=<n>
            mb_per_activation=<measured> budgeted_mb_per_activation=<n> memory_bounded=<0|1>]
"""
import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from hivemind.p2p import P2P

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the repo root, for bench.* helpers

from protocol import messages as m  # noqa: E402
from protocol.tensors import TensorPayload  # noqa: E402

from peer.transport.hivemind_p2p import HivemindTransport  # noqa: E402
from peer.transport.rpc import RpcClient, RpcServer  # noqa: E402

PAYLOAD_MB = 16


async def transport(pings: int, sends: int) -> str:
    server_p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    client_p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                  initial_peers=[str(a) for a in await server_p2p.get_visible_maddrs()])
    try:
        server = RpcServer()
        got = []

        async def on_ping(remote, req):
            return m.Pong(req.nonce)

        async def on_forward(remote, req):
            got.append(len(req.tensor.data))
            return m.ForwardReply(req.header)

        server.register(m.Ping, on_ping)
        server.register(m.ForwardRequest, on_forward)
        await HivemindTransport(server_p2p).serve(server.handle)
        client = RpcClient(HivemindTransport(client_p2p))
        target = server_p2p.peer_id.to_base58()
        for i in range(5):  # warm up the connection
            await client.call(target, m.Ping(i), 10.0)
        rtts, idle_rtts = [], []
        for i in range(pings):
            t0 = time.perf_counter()
            await client.call(target, m.Ping(i), 10.0)
            rtts.append((time.perf_counter() - t0) * 1000)
        for i in range(max(10, pings // 10)):   # a pipeline hop usually follows a pause
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            await client.call(target, m.Ping(i), 10.0)
            idle_rtts.append((time.perf_counter() - t0) * 1000)
        idle = statistics.median(idle_rtts)
        data = np.random.default_rng(0).standard_normal(PAYLOAD_MB * 1024 * 1024 // 4, dtype=np.float32).tobytes()
        payload = TensorPayload("float32", (len(data) // 4,), data)
        header = m.WorkHeader("bench", 1, 0, 0, 1)
        rates = []
        for _ in range(sends):
            t0 = time.perf_counter()
            await client.call(target, m.ForwardRequest(header, payload), 60.0)
            rates.append(len(data) / 1e6 / (time.perf_counter() - t0))
        assert got and all(n == len(data) for n in got)
        rtts.sort()
        median, p95 = statistics.median(rtts), rtts[int(0.95 * (len(rtts) - 1))]
        rate = statistics.median(rates)
        print(f"per-hop overhead (Ping round trip, {pings} calls): median {median:.2f} ms, p95 {p95:.2f} ms "
              f"(target < 10 ms: {'met' if median < 10 else 'NOT met'}); after a 50 ms pause: median {idle:.2f} ms")
        print(f"{PAYLOAD_MB} MB forward request ({sends} sends): median {rate:.0f} MB/s, "
              f"min {min(rates):.0f}, max {max(rates):.0f} (target >= 200 MB/s: {'met' if rate >= 200 else 'NOT met'})")
        return (f"hop_overhead_ms={median:.2f} hop_p95_ms={p95:.2f} hop_after_pause_ms={idle:.2f} "
                f"throughput_mb_s={rate:.0f}")
    finally:
        await client_p2p.shutdown()
        await server_p2p.shutdown()


def memory() -> str:
    from bench.peer_memory import measure
    with tempfile.TemporaryDirectory(prefix="skippipe-mem-") as work:
        r = measure(Path(work))
    print(f"peer memory: RSS growth {r['growth_mb']:.0f} MB with --max-activations 2 (budget {r['budget_mb']:.0f} MB, "
          f"runtime overhead beyond it up to {r['overhead_mb']:.0f} MB, the same at any setting if bounded); "
          f"one more stashed microbatch costs {r['mb_per_activation']:.1f} MB, budgeted "
          f"{r['budgeted_mb_per_activation']:.1f} MB ({'bounded' if r['bounded'] else 'NOT bounded'}); "
          f"{r['seconds']:.0f}s")
    return (f"rss_growth_mb={r['growth_mb']:.0f} activation_budget_mb={r['budget_mb']:.0f} "
            f"runtime_overhead_mb={r['overhead_mb']:.0f} mb_per_activation={r['mb_per_activation']:.1f} "
            f"budgeted_mb_per_activation={r['budgeted_mb_per_activation']:.1f} memory_bounded={int(r['bounded'])}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pings", type=int, default=200)
    p.add_argument("--sends", type=int, default=8)
    p.add_argument("--no-memory", action="store_true", help="skip the peer memory part (about 2 minutes)")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                   help="event loop of the transport part (default: uvloop, as the peers and the coordinator run)")
    a = p.parse_args()
    from opsweb.stopping import run_loop
    print(f"event loop: {a.loop}")
    figures = [run_loop(transport(a.pings, a.sends), a.loop)]
    if not a.no_memory:
        figures.append(memory())
    print("RESULT " + " ".join(figures))
