"""An in-process coordinator plus peer subprocesses on 127.0.0.1, for swarm tests and benchmarks."""
import asyncio
import contextlib
import dataclasses
import time

from protocol.topology import Links

from coordinator.app import CoordinatorApp
from coordinator.config import CoordinatorConfig
from launcher.processes import start_peer, terminate_processes, wait_or_kill

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)


def stop_processes(processes, grace_s: float = 10.0) -> None:
    """SIGTERM each process group, wait up to `grace_s`, then SIGKILL what is left."""
    terminate_processes(processes)
    wait_or_kill(processes, grace_s)


@contextlib.asynccontextmanager
async def coordinator(**overrides):
    config = dataclasses.replace(CoordinatorConfig(run="t", host_maddrs=LOOPBACK, microbatch_samples=2,
                                                   seq_len=32, microbatches_per_origin=2), **overrides)
    app = CoordinatorApp(config)
    task = asyncio.create_task(app.run())
    await asyncio.wait_for(app.ready.wait(), 60)
    try:
        yield app
    finally:
        app.stop.set()
        await asyncio.wait_for(task, 30)


@contextlib.contextmanager
def peers(app: CoordinatorApp, tmp_path, count: int, *extra: str, stages: list[int] | None = None):
    procs = []
    try:
        for i in range(count):
            args = ["--initial-peers", *app.maddrs, "--run", app.run_address, "--device", "cpu",
                    "--host-maddrs", *LOOPBACK, "--cache-dir", str(tmp_path / "cache"), *extra]
            if stages is not None:
                args += ["--stage", str(stages[i])]
            procs.append(start_peer(args, tmp_path / f"peer{i}.log"))
        yield procs
    finally:
        stop_processes(procs)


async def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll an async or plain predicate until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def planned_with(slow: set[str]):
    """A coordinator's adjust_topology: 1 ms links and equal compute except `slow` peers (3x), so
    the plan does not hang on what a loaded machine happened to measure."""
    def adjust(topology):
        n = len(topology.nodes)
        nodes = tuple(dataclasses.replace(node, fwd_s_per_layer_sample=0.003 if node.id in slow else 0.001)
                      for node in topology.nodes)
        lat = tuple(tuple(0.0 if i == j else 1.0 for j in range(n)) for i in range(n))
        bw = tuple(tuple(0.0 if i == j else 1.0 for j in range(n)) for i in range(n))
        return dataclasses.replace(topology, nodes=nodes, links=Links(lat, bw))
    return adjust
