"""What bench/multihost.py asks from inside a host's namespace; prints one JSON line.

  python bench/netns_probe.py links RUN MADDR...        {reporter: {peer: bandwidth bytes/s}}
  python bench/netns_probe.py schedule RUN MADDR...     {"epoch": n, "hops": {peer: hops on routes},
                                                         "stages": {peer: stage}}
  python bench/netns_probe.py transfer RUN PEER SIZES MADDR...
      {size: seconds}: the fastest of 3 one-way deliveries of `size` bytes to PEER, dialed by the
      address it advertises (SIZES is comma-separated)
"""
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hivemind import DHT  # noqa: E402
from opsweb.dht_process import safe_for_large_calls  # noqa: E402
from hivemind.p2p import P2P  # noqa: E402

from coordinator.dht_io import CoordinatorRecords
from swarmcore.dht.validators import record_validators  # noqa: E402
from protocol import messages as m  # noqa: E402
from peer.transport.hivemind_p2p import HivemindTransport  # noqa: E402
from protocol.tensors import TensorPayload  # noqa: E402
from peer.transport.rpc import RemoteError, RpcClient  # noqa: E402


async def timed_sends(rpc: RpcClient, peer: str, sizes: list[int], reps: int = 3) -> dict[int, float]:
    """Seconds to deliver `size` bytes one way, as an activation travels: a streamed
    ForwardRequest for a run the peer does not serve, which it reads in full before it
    answers UNKNOWN_RUN (a tiny reply). The fastest of `reps`."""
    out = {}
    await rpc.call(peer, m.Ping(0), 30.0)                     # connect first: not part of a transfer
    for size in sizes:
        request = m.ForwardRequest(m.WorkHeader("no-such-run", 1, 0, 0, 1),
                                   TensorPayload("uint8", (size,), bytes(size)))
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            try:
                await rpc.call(peer, request, 60.0)
            except RemoteError:
                pass                                          # the expected UNKNOWN_RUN, after the read
            best = min(best, time.perf_counter() - t0)
        out[size] = best
    return out


async def _transfer(records: CoordinatorRecords, peer: str, sizes: list[int]) -> dict[int, float]:
    adverts = await records.get_adverts()
    maddrs = [f"{a}/p2p/{peer}" if "/p2p/" not in a else a for a in adverts[peer].maddrs]
    p2p = await P2P.create(initial_peers=maddrs)
    try:
        return await timed_sends(RpcClient(HivemindTransport(p2p)), peer, sizes)
    finally:
        await p2p.shutdown()


def main(argv: list[str]) -> int:
    what, run = argv[0], argv[1]
    rest = argv[2:]
    peer, sizes = (rest[0], [int(s) for s in rest[1].split(",")]) if what == "transfer" else (None, [])
    maddrs = rest[2:] if what == "transfer" else rest
    dht = safe_for_large_calls(DHT(start=True, initial_peers=maddrs, client_mode=True,
                                   record_validators=record_validators(run)[1]))
    try:
        records = CoordinatorRecords(dht, run)
        if what == "links":
            links = asyncio.run(records.get_links())
            out = {r: {x.peer_id: x.bandwidth_bytes_s for x in rep.links} for r, rep in links.items()}
        elif what == "schedule":
            schedule = asyncio.run(records.get_schedule(any_signer=True))
            hops: dict[str, int] = {}
            for route in schedule.routes if schedule else ():
                for hop in route.hops:
                    hops[hop.peer] = hops.get(hop.peer, 0) + 1
            out = {"epoch": schedule.epoch if schedule else None, "hops": hops,
                   "stages": schedule.stage_of() if schedule else {}}
        elif what == "transfer":
            out = asyncio.run(_transfer(records, peer, sizes))
        else:
            raise SystemExit(f"unknown probe {what!r}")
    finally:
        dht.shutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
