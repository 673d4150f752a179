"""An in-process swarm over the in-memory transport: the real worker and handlers, no sockets."""
import asyncio

import torch

from protocol import messages as m
from protocol.schedule import Hop, Route, Schedule, StageAssignment

from peer.compute.runner import StageRunner
from peer.data import TextDataset
from peer.pipeline.handlers import WorkHandlers
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.worker import PipelineWorker, StageSeat, WorkerHooks, WorkerSettings
from peer.transport.memory import MemoryNetwork
from peer.transport.rpc import RpcClient, RpcServer


def make_schedule(run: str, stage_of: dict[str, int], paths: dict[int, list[str]], epoch: int = 1,
                  skip_ratio: float = 0.0) -> Schedule:
    """paths: microbatch id -> the peers it visits, origin first."""
    routes = tuple(Route(mb, tuple(Hop(stage_of[p], p) for p in peers)) for mb, peers in sorted(paths.items()))
    return Schedule(run=run, epoch=epoch, strategy="manual", num_stages=max(stage_of.values()) + 1,
                    skip_ratio=skip_ratio, assignment=tuple(StageAssignment(p, s) for p, s in stage_of.items()),
                    routes=routes)


class RecordingRunner(StageRunner):
    """Keeps the gradient vector and samples it stepped with, for comparisons in tests."""

    def step(self):
        self.stepped_with = (self.grad_vector().clone(), self.samples_this_step)
        return super().step()


def batches_for(spec: m.RunSpec, corpus_seed: int = 0):
    gen = torch.Generator().manual_seed(corpus_seed)
    cache = {}

    def batch(iteration: int, local: int, shard: int, shards: int, positions=None):
        key = (iteration, local, shard, shards)
        if key not in cache:
            t = torch.randint(0, 256, (spec.microbatch_samples, spec.seq_len + 1), generator=gen)
            cache[key] = (t[:, :-1].contiguous(), t[:, 1:].contiguous())
        return cache[key]
    return batch, cache


class Killed(Exception):
    """A peer of the in-memory swarm was killed by the test."""


def kill_hook(network: MemoryNetwork, peer: str, iteration: int, kind: str):
    """A fault hook that makes `peer` vanish (like kill -9) at its first `kind` task of `iteration`."""
    def hook(i: int, task_kind: str) -> None:
        if i == iteration and task_kind == kind:
            network.handlers.pop(peer, None)
            raise Killed(peer)
    return hook


async def build_memory_swarm(spec: m.RunSpec, schedule: Schedule, batch, timeout: float = 60.0,
                             kill: dict[str, tuple[int, str]] | None = None, share_dtype: str = "float32",
                             wire_compression: str = "auto", faults: dict | None = None, **settings):
    """Workers (serving, not yet running) for every peer of `schedule`, and their network.
    `faults`: peer -> a fault hook of its own (peer/chaos.py make_hook); `settings`: more
    WorkerSettings fields for every peer.
    `kill`: peer -> (iteration, task kind) at which that peer dies. `share_dtype`: float32
    (exact, so results can be compared with one process), or the peers' default float16.
    `wire_compression`: the peers' --wire-compression (auto: what the schedule's `wire` says)."""
    network = MemoryNetwork()
    workers = {}
    for peer in schedule.stage_of():
        book = ScheduleBook()
        book.add(schedule)
        transport = network.transport(peer)
        fault = kill_hook(network, peer, *kill[peer]) if kill and peer in kill else (faults or {}).get(peer)
        worker = PipelineWorker(
            peer, spec, RpcClient(transport), book,
            StageSeat(lambda stage: RecordingRunner.from_spec(spec, stage, max_stash=16)),
            settings=WorkerSettings(iteration_timeout_s=timeout, share_dtype=share_dtype,
                                    wire_compression=wire_compression, **settings),
            hooks=WorkerHooks(batch=batch, fault=fault))
        server = RpcServer()

        async def no_refresh():
            return None
        WorkHandlers(worker, no_refresh).register(server)
        await transport.serve(server.handle)
        workers[peer] = worker
    return network, workers


async def run_memory_swarm(spec: m.RunSpec, schedule: Schedule, batch, timeout: float = 60.0,
                           kill: dict[str, tuple[int, str]] | None = None, share_dtype: str = "float32",
                           wire_compression: str = "auto", faults: dict | None = None, **settings):
    """Run every peer of `schedule` to spec.max_steps; killed peers vanish, the others carry on."""
    _, workers = await build_memory_swarm(spec, schedule, batch, timeout, kill, share_dtype, wire_compression,
                                          faults, **settings)
    results = await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers.values()),
                                                    return_exceptions=True), timeout)
    for peer, result in zip(workers, results):
        if isinstance(result, BaseException) and not (isinstance(result, Killed) and kill and peer in kill):
            raise result
    return workers


def batch_fn(spec: m.RunSpec, train: TextDataset):
    """An origin's batch function over `train`: each data shard's samples for an iteration, by
    the spec's seed (what bench/convergence.py and bench/byzantine.py train on)."""
    shards = {}

    def batch(iteration, local, shard, count, positions=None):
        if (shard, count) not in shards:
            shards[(shard, count)] = train.shard(shard, count)
        return shards[(shard, count)].batch(seed=spec.seed, iteration=iteration, microbatch=local,
                                            samples=spec.microbatch_samples, seq_len=spec.seq_len)
    return batch
