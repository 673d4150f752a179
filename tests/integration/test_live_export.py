"""export --initial-peers: the stages' current weights pulled from live workers over the RPC
layer (in-memory transport here; real hivemind P2P in tests/swarm), then a Hugging Face folder."""
import asyncio

import pytest
import torch

from protocol import messages as m
from protocol.errors import ErrorCode

from peer.compute.model import Decoder, spec_config
from peer.compute.runner import StageRunner
from peer.live_export import LiveExportError, pull_run
from peer.pipeline.handlers import WorkHandlers
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.worker import PipelineWorker, StageSeat, WorkerSettings
from peer.transport.memory import MemoryNetwork
from peer.transport.rpc import RemoteError, RpcClient, RpcServer

SPEC = m.RunSpec(run="live", model="tiny", num_stages=3, skip_ratio=0.0, seed=2)


async def live_workers(network, stage_of):
    """Workers holding a stepped runner of their stage (as mid-run), serving the real handlers."""
    workers = {}
    for peer, stage in stage_of.items():
        w = PipelineWorker(peer, SPEC, RpcClient(network.transport(peer)), ScheduleBook(),
                           StageSeat(lambda s: StageRunner.from_spec(SPEC, s)),
                           settings=WorkerSettings())
        w.seat.runner, w.seat.stage, w.seat.stepped_iteration = StageRunner.from_spec(SPEC, stage), stage, 6
        gen = torch.Generator().manual_seed(stage)
        for p in w.seat.runner.module.parameters():          # trained away from the seeded init
            p.grad = torch.randn(p.shape, generator=gen)
        w.seat.runner.samples_this_step = 1
        w.seat.runner.step()
        server = RpcServer()

        async def no_refresh():
            return None
        WorkHandlers(w, no_refresh).register(server)
        await network.transport(peer).serve(server.handle)
        workers[peer] = w
    return workers


async def test_every_stage_is_pulled_from_a_live_replica_and_matches_it():
    network = MemoryNetwork()
    workers = await live_workers(network, {"a": 0, "b": 1, "c": 2})
    client = RpcClient(network.transport("exporter"))
    # the first replica listed for stage 1 is gone: the next one answers
    stages, iterations = await pull_run(client, SPEC, {0: ["a"], 1: ["gone", "b"], 2: ["c"]})
    assert iterations == [6, 6, 6]
    for s, peer in enumerate("abc"):
        assert torch.equal(torch.cat([p.reshape(-1) for p in stages[s].parameters()]),
                           workers[peer].seat.runner.parameter_vector())
    ref = Decoder(spec_config(SPEC), seed=0)
    state = {}
    for w in workers.values():
        state.update(w.seat.runner.module.global_state_dict())
    ref.load_state_dict({n.replace("layers.", "layers.blocks.", 1) if n.startswith("layers.") else n: t
                         for n, t in state.items()})
    tokens = torch.randint(0, 257, (1, 12))
    with torch.no_grad():
        hidden = stages[0].embed_tokens(tokens)
        for st in stages:
            hidden = st(hidden)
        assert torch.allclose(stages[0].logits(hidden), ref(tokens)[0], atol=1e-6)
    for w in workers.values():
        w.seat.executor.shutdown(wait=False)


async def test_missing_stage_and_stale_snapshot_are_clear_errors():
    network = MemoryNetwork()
    workers = await live_workers(network, {"a": 0, "b": 1})
    client = RpcClient(network.transport("exporter"))
    with pytest.raises(LiveExportError, match=r"no peer for stage\(s\) 2"):
        await pull_run(client, SPEC, {0: ["a"], 1: ["b"]})
    with pytest.raises(LiveExportError, match="no replica of stage 2"):
        await pull_run(client, SPEC, {0: ["a"], 1: ["b"], 2: ["a"]})     # a hosts stage 0, not 2
    with pytest.raises(RemoteError) as err:
        await client.call("a", m.WeightsRequest("live", 0, snapshot=7, offset=0), 5.0)
    assert err.value.code == ErrorCode.WRONG_STAGE and "gone" in str(err.value)
    for w in workers.values():
        w.seat.executor.shutdown(wait=False)
    await asyncio.sleep(0)
