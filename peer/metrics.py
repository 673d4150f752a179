"""The peer's Prometheus metrics (/metrics) and JSON status (/api/status), read-only views
of the PeerApp; RPC latency and bytes come from a thin wrapper around the transport."""
import json
import time
from typing import Sequence

from opsweb.prom import CONTENT_TYPE, Exposition, Histogram, process_rss_bytes
from opsweb.server import Response

from peer.transport.base import Handler, OnSent, Transport, TransportError
from swarmcore.outcomes import OUTCOMES

COUNT_KINDS = OUTCOMES


class PeerMetrics:
    def __init__(self):
        self.rpc_out = {"ok": Histogram(), "error": Histogram()}   # requests we sent, by outcome
        self.rpc_in = Histogram()                                   # requests we answered
        self.bytes_sent = 0
        self.bytes_received = 0
        self.inbound_peers: set[str] = set()   # who dialed us: evidence of reachability


class MeteredTransport(Transport):
    """Delegates to `inner`, timing requests and counting payload bytes both ways."""

    def __init__(self, inner: Transport, metrics: PeerMetrics):
        self.inner, self.metrics = inner, metrics
        self.peer_id = inner.peer_id

    def __getattr__(self, name):  # p2p and other extras of the real transport
        return getattr(self.inner, name)

    async def request(self, peer: str, frames: Sequence[bytes], timeout: float, on_sent: OnSent = None) -> bytes:
        started = time.perf_counter()
        self.metrics.bytes_sent += sum(len(f) for f in frames)
        try:
            reply = await self.inner.request(peer, frames, timeout, on_sent)
        except TransportError:
            self.metrics.rpc_out["error"].observe(time.perf_counter() - started)
            raise
        self.metrics.rpc_out["ok"].observe(time.perf_counter() - started)
        self.metrics.bytes_received += len(reply)
        return reply

    async def serve(self, handler: Handler) -> None:
        metrics = self.metrics

        async def metered(remote: str, recv) -> bytes:
            started = time.perf_counter()
            metrics.inbound_peers.add(remote)

            async def counted() -> bytes:
                frame = await recv()
                metrics.bytes_received += len(frame)
                return frame
            reply = await handler(remote, counted)
            metrics.bytes_sent += len(reply)
            metrics.rpc_in.observe(time.perf_counter() - started)
            return reply
        await self.inner.serve(metered)

    async def close(self) -> None:
        await self.inner.close()


def cuda_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch
    return int(torch.cuda.memory_allocated(torch.device(device)))


def totals(history) -> dict[str, int]:
    return {k: sum(o.counts.get(k, 0) for o in history) for k in COUNT_KINDS}


def last_iteration(worker, seq_len: int) -> tuple[float, float]:
    """(seconds, tokens/s) of the worker's last finished iteration; tokens only on origins."""
    if not worker.ledger.history:
        return 0.0, 0.0
    last = worker.ledger.history[-1]
    took = max(last.finished_at - last.started_at, 1e-9)
    return took, last.samples * seq_len / took


def render_metrics(app) -> str:
    """Prometheus text of a running PeerApp (attributes missing before start-up read as 0)."""
    e, m = Exposition(), app.metrics
    worker = getattr(app, "worker", None)
    e.gauge("skippipe_peer_up", "1 while the peer serves its stage", 1)
    e.gauge("skippipe_peer_reachable", "1 if the start-up self-test found a dialable address",
            int(app.reachability is not None and bool(app.reachability.dialable)))
    for outcome, hist in m.rpc_out.items():
        e.histogram("skippipe_peer_rpc_seconds", "latency of RPCs this peer sent", hist, {"outcome": outcome})
    e.histogram("skippipe_peer_rpc_served_seconds", "time to answer RPCs from other peers", m.rpc_in)
    e.counter("skippipe_peer_bytes_sent_total", "RPC payload bytes sent", m.bytes_sent)
    e.counter("skippipe_peer_bytes_received_total", "RPC payload bytes received", m.bytes_received)
    e.gauge("skippipe_peer_inbound_peers", "distinct peers that dialed us", len(m.inbound_peers))
    e.gauge("skippipe_peer_memory_rss_bytes", "resident memory of this process", process_rss_bytes())
    if worker is not None:
        cuda = cuda_bytes(app.config.device)
        if cuda is not None:
            e.gauge("skippipe_peer_cuda_allocated_bytes", "CUDA memory held by tensors", cuda)
        took, tokens_s = last_iteration(worker, worker.spec.seq_len)
        e.gauge("skippipe_peer_iteration", "the iteration this peer is working on", worker.ledger.iteration)
        stage = worker.seat.stage
        e.gauge("skippipe_peer_stage", "hosted stage (-1: none yet)", -1 if stage is None else stage)
        e.counter("skippipe_peer_stale_stage_starts_total", "stages taken mid-run without their current state "
                  "(fresh weights or an older checkpoint: training lost)", worker.seat.stale_starts)
        e.counter("skippipe_peer_hop_deadline_misses_total", "microbatches routed around a next hop that kept "
                  "them past their hop deadline (peer/pipeline/hop_deadlines.py)", worker.recovery.deadline_misses)
        e.counter("skippipe_peer_backward_gradients_left_out_total", "returned gradients taken as zero: of "
                  "outlying size for their stage, or from a peer that failed a backward check",
                  worker.spot.stats["backward_left_out"])
        e.gauge("skippipe_peer_late_peers", "peers marked late by our hop deadlines now", len(worker.recovery.health.late_peers()))
        e.gauge("skippipe_peer_iteration_seconds", "duration of the last finished iteration", took)
        e.gauge("skippipe_peer_tokens_per_second", "tokens/s of the last iteration (stage-0 peers)", tokens_s)
        for codec, n in worker.sender.wire.sent.items():
            e.counter("skippipe_peer_wire_tensors_sent_total", "activations and gradients sent to the next hop, "
                      "by codec (off: floats; --wire-compression)", n, {"codec": codec})
        for kind, n in totals(worker.ledger.history).items():
            e.counter("skippipe_peer_microbatches_total", "microbatches by how they ended", n, {"outcome": kind})
        e.gauge("skippipe_peer_queue_depth", "work waiting in the inbox", len(worker.inbox), {"queue": "inbox"})
        if worker.seat.runner is not None:
            e.gauge("skippipe_peer_queue_depth", "work waiting in the inbox", worker.seat.runner.stashed,
                    {"queue": "stashed_activations"})
    return e.render()


def metrics_routes(app) -> dict:
    def metrics() -> Response:
        return 200, CONTENT_TYPE, render_metrics(app).encode()

    def status() -> Response:
        from peer.status import status_dict
        return 200, "application/json", json.dumps(status_dict(app)).encode()
    return {"/metrics": metrics, "/api/status": status}
