"""The link emulator: latency + bytes / bandwidth per send, bandwidth shared on a link."""
import asyncio
import json
import time

import pytest

from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload, topology_to_json

from peer.emulated_node import Emulation, EmulationError, emulate, load_emulation
from peer.transport.base import TransportError
from peer.transport.emulator import EmulatedTransport, SharedLink
from peer.transport.memory import MemoryNetwork

MB = 1_000_000


def topology(slowdown=1.0) -> Topology:
    w = Workload(num_layers=3, num_stages=3, microbatch_samples=1, microbatches_per_data_node=1,
                 activation_bytes_per_sample=1, memory_microbatches=2)
    nodes = (Node("a", 0.01), Node("b", 0.01, slowdown=slowdown), Node("c", 0.01))
    lat = ((0, 100, 20), (50, 0, 0), (20, 0, 0))              # ms; a->b 100, b->a 50
    bw = ((1, 10 * MB / 2**30, 1), (1, 1, 1), (1, 1, 1))       # GiB/s; a->b 10 MB/s
    return Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, bw))


async def network_of(emulation: Emulation):
    net = MemoryNetwork()
    for peer in ("peer-a", "peer-b", "peer-c", "stranger"):
        reply = b"r" * 10

        async def handler(remote, recv, reply=reply):
            await recv()
            return reply
        await net.transport(peer).serve(handler)
    return EmulatedTransport(net.transport("peer-a"), emulation.links)


def emulation_a() -> Emulation:
    return Emulation(topology(), "a", {"peer-a": "a", "peer-b": "b", "peer-c": "c"})


async def timed(coro) -> float:
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


def test_latency_both_ways_and_transmission_time():
    async def main():
        tr = await network_of(emulation_a())
        small = await timed(tr.request("peer-b", [b"x"], 5.0))
        big = await timed(tr.request("peer-b", [bytes(MB)], 5.0))      # + 1 MB at 10 MB/s
        free = await timed(tr.request("stranger", [bytes(MB)], 5.0))    # not a node: no delay
        return small, big, free
    small, big, free = asyncio.run(main())
    assert 0.15 <= small < 0.4                 # 100 ms out + 50 ms back
    assert 0.25 <= big < 0.6
    assert free < 0.05


def test_concurrent_sends_share_one_links_bandwidth_but_not_other_links():
    async def main():
        tr = await network_of(emulation_a())
        t0 = time.perf_counter()
        ends = []

        async def send(peer):
            await tr.request(peer, [bytes(MB)], 5.0)
            ends.append((peer, time.perf_counter() - t0))
        await asyncio.gather(send("peer-b"), send("peer-b"))
        shared = [t for _, t in ends]
        return shared
    shared = asyncio.run(main())
    # two 1 MB sends at 10 MB/s shared: both finish at ~0.2 s + 0.15 s latency (not 0.1 and 0.2)
    assert min(shared) >= 0.33
    assert max(shared) - min(shared) < 0.05


def test_shared_link_fair_share_lets_a_short_transfer_out_first():
    async def main():
        link = SharedLink(10 * MB)
        t0 = time.perf_counter()
        ends = {}

        async def go(name, n):
            await link.transfer(n)
            ends[name] = time.perf_counter() - t0
        await asyncio.gather(go("big", 2 * MB), go("small", MB // 2))
        return ends
    ends = asyncio.run(main())
    assert 0.09 <= ends["small"] < 0.16        # 0.5 MB at half of 10 MB/s
    assert 0.24 <= ends["big"] < 0.35          # 2.5 MB in all at 10 MB/s
    with pytest.raises(ValueError):
        SharedLink(0)


def test_emulated_delay_counts_against_the_timeout():
    async def main():
        tr = await network_of(emulation_a())
        with pytest.raises(TransportError, match="emulated"):
            await tr.request("peer-b", [bytes(2 * MB)], 0.1)
    asyncio.run(main())


def test_emulation_maps_peers_and_reports_slowdown(tmp_path):
    topo = tmp_path / "t.json"
    topo.write_text(topology_to_json(topology(slowdown=2.5)))
    (tmp_path / "m.json").write_text(json.dumps({"peer-a": "a", "peer-b": "b"}))
    em = load_emulation(topo, "b", tmp_path / "m.json")
    assert em.slowdown == 2.5
    assert em.links("peer-a") == ((0.05, 1 * 2**30), (0.1, 10 * MB))
    assert em.links("c") is not None          # a peer id that is itself a node id
    assert em.links("peer-b") is None and em.links("nobody") is None
    with pytest.raises(EmulationError, match="not a node"):
        load_emulation(topo, "zz")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(EmulationError, match="node map"):
        load_emulation(topo, "a", tmp_path / "bad.json")
    (tmp_path / "unk.json").write_text(json.dumps({"p": "nope"}))
    with pytest.raises(EmulationError, match="unknown node"):
        load_emulation(topo, "a", tmp_path / "unk.json")
    with pytest.raises(EmulationError, match="cannot read"):
        load_emulation(tmp_path / "missing.json", "a")


def test_off_by_default_and_logged_when_on(tmp_path, caplog):
    net = MemoryNetwork()
    inner = net.transport("p")
    assert emulate(inner, None, "", None) == (inner, None)
    topo = tmp_path / "t.json"
    topo.write_text(topology_to_json(topology()))
    with caplog.at_level("WARNING"):
        wrapped, em = emulate(inner, topo, "a", None)
    assert isinstance(wrapped, EmulatedTransport) and em.node_id == "a"
    assert "LINK EMULATION ON" in caplog.text
