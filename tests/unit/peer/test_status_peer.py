"""peer.metrics (transport metering, /metrics before and after start-up) and
peer.reachability (the start-up self-test), on real sockets and the in-memory transport."""
import asyncio
import json

import pytest

from peer.app import PeerApp
from peer.config import PeerConfig
from peer.metrics import MeteredTransport, PeerMetrics, metrics_routes, render_metrics
from peer.reachability import is_public, self_test, split_maddr
from peer.transport.base import TransportError
from peer.transport.memory import MemoryNetwork
from tests.unit.opsweb.test_status_prom import samples


async def test_metered_transport_counts_bytes_latency_and_inbound_peers():
    net = MemoryNetwork()
    a_metrics, b_metrics = PeerMetrics(), PeerMetrics()
    a = MeteredTransport(net.transport("A"), a_metrics)
    b = MeteredTransport(net.transport("B"), b_metrics)

    async def echo_twice(remote, recv):
        first, second = await recv(), await recv()
        return first + second

    await b.serve(echo_twice)
    assert await a.request("B", [b"12345", b"678"], timeout=5) == b"12345678"
    with pytest.raises(TransportError):
        await a.request("C", [b"x"], timeout=5)
    assert a.peer_id == "A"
    assert (a_metrics.bytes_sent, a_metrics.bytes_received) == (8 + 1, 8)
    assert (b_metrics.bytes_received, b_metrics.bytes_sent) == (8, 8)
    assert a_metrics.rpc_out["ok"].count == 1 and a_metrics.rpc_out["error"].count == 1
    assert b_metrics.rpc_in.count == 1 and b_metrics.inbound_peers == {"A"}


async def test_self_test_on_a_real_listener():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await self_test([f"/ip4/127.0.0.1/tcp/{port}/p2p/QmMe"])
    finally:
        server.close()
        await server.wait_closed()
    assert result.verdict == "local-only" and result.dialable and not result.public and not result.relayed
    assert f"TCP port {port}" in result.advice and "--announce-maddrs" in result.advice
    closed = await self_test([f"/ip4/127.0.0.1/tcp/{port}/p2p/QmMe"], timeout_s=1.0)
    assert closed.verdict == "unreachable" and not closed.dialable and str(port) in closed.advice


async def test_relayed_only_peer_is_told_to_forward_a_port():
    result = await self_test(["/ip4/203.0.113.9/tcp/4001/p2p/QmRelay/p2p-circuit/p2p/QmMe"])
    assert result.verdict == "relayed" and result.relayed and "forward" in result.advice


def test_address_helpers():
    assert split_maddr("/ip4/1.2.3.4/tcp/31337/p2p/Qm") == ("ip4", "1.2.3.4", 31337)
    assert split_maddr("/ip4/1.2.3.4/udp/1/quic") is None and split_maddr("/unix/x") is None
    assert is_public("ip4", "8.8.8.8") and not is_public("ip4", "10.0.0.1") and not is_public("ip4", "127.0.0.1")
    assert is_public("dns4", "swarm.example.org") and not is_public("ip4", "not-an-ip")


def test_metrics_and_status_before_start_up():
    app = PeerApp(PeerConfig(initial_peers=("/ip4/127.0.0.1/tcp/1/p2p/Qm",)))
    got = samples(render_metrics(app))
    assert got["skippipe_peer_up"] == 1 and got["skippipe_peer_reachable"] == 0
    assert got['skippipe_peer_rpc_seconds_count{outcome="ok"}'] == 0
    assert "skippipe_peer_iteration" not in got          # no worker yet: no made-up numbers
    status, content_type, body = metrics_routes(app)["/api/status"]()
    assert status == 200 and json.loads(body) == {"state": "JOINING", "run": "default", "device": "cpu",
                                                  "reachability": None}


def test_metrics_port_flag():
    from peer.cli import build_parser, config_from_args
    base = ["--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4"]
    assert config_from_args(build_parser().parse_args(base)).metrics_port is None
    cfg = config_from_args(build_parser().parse_args(base + ["--metrics-port", "9100", "--metrics-host", "0.0.0.0"]))
    assert (cfg.metrics_port, cfg.metrics_host) == (9100, "0.0.0.0")
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--metrics-port", "70000"])


def test_a_waiting_peers_status_line_says_why():
    from types import SimpleNamespace
    from peer.pipeline.schedule_book import ScheduleBook
    from peer.status import status_line
    worker = SimpleNamespace(seat=SimpleNamespace(stage=None, runner=None),
                             ledger=SimpleNamespace(history=[], iteration=0),
                             inbox=[], me="12D3KooWMe", isolation=SimpleNamespace(cut_off=False), book=ScheduleBook())
    assert "stage=- waiting: no schedule yet iteration=0" in status_line(worker, worker.me, "ONLINE")
    worker.book = SimpleNamespace(latest=SimpleNamespace(epoch=3, stage_of=lambda: {"12D3KooWOther": 0}))
    assert "waiting: not in schedule epoch 3 yet" in status_line(worker, worker.me, "ONLINE")
    worker.seat.stage = 1
    assert "waiting" not in status_line(worker, worker.me, "ONLINE")
