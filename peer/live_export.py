"""`export --initial-peers MADDR --run NAME`: every stage's current weights from a live run.

Joins the run's DHT as a client (a throwaway identity, the run's validators), reads the run
spec and the schedule, and asks one replica of each stage for its parameters with
WeightsRequest: the late joiners' chunked state transfer (state_sync.py), parameters only,
from one snapshot per stage. Training goes on meanwhile, so stages may come from
neighbouring iterations; the summary line says which.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import torch

from protocol import messages as m
from protocol.errors import ProtocolError

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from peer.compute.model import spec_config
from peer.compute.stage_checkpoint import CheckpointError
from peer.compute.stages import StageModule, layer_ranges
from peer.pipeline.state_sync import CHUNK_ELEMENTS
from peer.transport.base import TransportError
from peer.transport.rpc import RemoteError, RpcClient

logger = logging.getLogger(__name__)
RPC_TIMEOUT_S = 30.0
DHT_WAIT_S = 30.0


class LiveExportError(CheckpointError):
    """The live run cannot be exported (one-line message)."""


async def pull_weights(rpc: RpcClient, peer: str, run: str, stage: int,
                       layers: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """(parameter vector, iteration) of `stage` from `peer`, all chunks from one snapshot."""
    snapshot, offset, out, iteration = 0, 0, None, -1
    while out is None or offset < out.numel():
        reply = await rpc.call(peer, m.WeightsRequest(run, stage, snapshot, offset, CHUNK_ELEMENTS), RPC_TIMEOUT_S)
        if not isinstance(reply, m.WeightsReply) or reply.stage != stage or reply.offset != offset:
            raise ValueError(f"unexpected reply {type(reply).__name__} to a weights request")
        if (reply.layer_start, reply.layer_end) != layers:
            raise ValueError(f"the peer holds layers {reply.layer_start}..{reply.layer_end}, the spec says {layers}")
        if out is None:
            snapshot, iteration = reply.snapshot, reply.iteration
            out = torch.empty(reply.total_elements, dtype=torch.float32)
        elif reply.snapshot != snapshot or reply.total_elements != out.numel():
            raise ValueError("the snapshot changed during the transfer")
        n = min(CHUNK_ELEMENTS, out.numel() - offset)
        out[offset:offset + n] = tensor_codec.decode(reply.tensor, expect_shape=(n,), expect_dtype="float32",
                                                     what="weights chunk")
        offset += n
    return out, iteration


def stage_from_vector(spec: m.RunSpec, stage: int, vector: torch.Tensor) -> StageModule:
    config = spec_config(spec)
    ranges = layer_ranges(config.n_layers, spec.num_stages, spec.stage_sizes)
    module = StageModule(config, stage, ranges[stage], seed=0)
    params = list(module.parameters())           # the runner's order: StageRunner._params
    if sum(p.numel() for p in params) != vector.numel():
        raise ValueError(f"stage {stage}: {vector.numel()} parameters received, the model needs "
                         f"{sum(p.numel() for p in params)}")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(vector[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
    return module.eval()


async def pull_run(rpc: RpcClient, spec: m.RunSpec, replicas: dict[int, list[str]]) -> tuple[list[StageModule], list[int]]:
    """Every stage from the first of its replicas that answers; one-line error if one cannot."""
    config = spec_config(spec)
    ranges = layer_ranges(config.n_layers, spec.num_stages, spec.stage_sizes)
    missing = [s for s in range(spec.num_stages) if not replicas.get(s)]
    if missing:
        raise LiveExportError(f"run {spec.run!r} has no peer for stage(s) {', '.join(map(str, missing))} right now")
    stages, iterations = [], []
    for s in range(spec.num_stages):
        errors = []
        for peer in replicas[s]:
            try:
                vector, iteration = await pull_weights(rpc, peer, spec.run, s, ranges[s])
                stages.append(stage_from_vector(spec, s, vector))
                iterations.append(iteration)
                break
            except (TransportError, RemoteError, BadTensor, ValueError, ProtocolError) as exc:
                errors.append(f"{peer[:12]}: {exc}")
        else:
            raise LiveExportError(f"no replica of stage {s} gave its weights ({'; '.join(errors)})")
    return stages, iterations


async def _from_dht(initial_peers: list[str], run: str, join_key: Path | None):
    from peer.app import StartupError, start_dht
    from peer.config import PeerConfig
    from peer.security.guard import PeerGuard
    from peer.transport.hivemind_p2p import HivemindTransport
    from protocol.signing import split_run_address
    try:
        run, organiser_key = split_run_address(run)      # NAME or NAME@KEY, as peers join
    except ProtocolError as exc:
        raise LiveExportError(f"--run: {exc}") from None
    loopback = all("/127.0.0.1/" in a for a in initial_peers)
    config = PeerConfig(initial_peers=tuple(initial_peers), run=run, organiser_key=organiser_key or "",
                        host_maddrs=("/ip4/127.0.0.1/tcp/0",) if loopback else ("/ip4/0.0.0.0/tcp/0",),
                        join_key_path=join_key)
    try:
        guard = PeerGuard(config)
    except ValueError as exc:
        raise LiveExportError(str(exc)) from None
    try:
        try:
            dht = start_dht(config, guard)
        except StartupError as exc:
            raise LiveExportError(str(exc)) from None
        try:
            p2p = await dht.replicate_p2p()
            transport = HivemindTransport(p2p)
            records = guard.records(dht, transport.peer_id)
            spec = schedule = None
            deadline = asyncio.get_running_loop().time() + DHT_WAIT_S
            while (spec is None or schedule is None) and asyncio.get_running_loop().time() < deadline:
                spec = spec or await records.get_spec()
                schedule = schedule or await records.get_schedule()
                if spec is None or schedule is None:
                    await asyncio.sleep(1.0)
            if spec is None:
                raise LiveExportError(f"no run {run!r} found through {' '.join(initial_peers)}")
            if schedule is None:
                raise LiveExportError(f"run {run!r} has no schedule yet: no peers are training")
            replicas: dict[int, list[str]] = {}
            for peer, stage in sorted(schedule.stage_of().items()):
                replicas.setdefault(stage, []).append(peer)
            stages, iterations = await pull_run(RpcClient(transport), spec, replicas)
            span = f"{min(iterations)}" if min(iterations) == max(iterations) else f"{min(iterations)}-{max(iterations)}"
            return stages, f"live run {run}, iteration {span}, {len(stages)} stages"
        finally:
            dht.shutdown()
    finally:
        guard.close()


def pull_stages(initial_peers: list[str], run: str, join_key: Path | None = None):
    """(stages, description) of a live run: what `export --initial-peers` writes out."""
    return asyncio.run(_from_dht(initial_peers, run, join_key))
