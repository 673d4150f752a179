"""What the checks cost on the multi-process local swarm (bench/byzantine.py --swarm-overhead):
a coordinator in this process and peer processes on 127.0.0.1 (real hivemind P2P and DHT, the
signed control plane, robust share combination, as always), trained with spot checks (forward
and backward) at a rate and without, one swarm after the other, alternated. Per side: seconds
per iteration (the coordinator's iteration summaries, after warm-up) and the peer processes' CPU
seconds per iteration (their own and their p2pd daemons', from /proc via psutil)."""
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.support.harness import LOOPBACK, coordinator, planned_with, stop_processes, wait_for
from launcher.processes import start_peer

STAGES = [0, 1, 0, 1]          # two pipelines; stage 1 replicated, so its hops can be checked
WARMUP = 5                     # iterations left out (connections, first plans, allocator)


def _cpu_s(procs) -> float:
    total = 0.0
    for p in procs:
        try:
            root = psutil.Process(p.pid)
            for proc in [root, *root.children(recursive=True)]:
                t = proc.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def _measure(rate: float, iterations: int, folder: Path) -> dict:
    async with coordinator(num_stages=2, skip_ratio=0.0, min_peers=len(STAGES), seq_len=64, microbatch_samples=4,
                           microbatches_per_origin=4, max_steps=WARMUP + iterations + 50) as app:
        app.adjust_topology = planned_with(set())
        folder.mkdir(parents=True, exist_ok=True)
        procs = []
        try:
            for i, stage in enumerate(STAGES):
                args = ["--initial-peers", *app.maddrs, "--run", app.run_address, "--device", "cpu",
                        "--host-maddrs", *LOOPBACK, "--cache-dir", str(folder / "cache"), "--no-benchmark",
                        "--stage", str(stage), "--spot-check-rate", str(rate)]
                procs.append(start_peer(args, folder / f"peer{i}-{rate}.log"))
            await wait_for(lambda: app.summaries and app.summaries[-1].iteration >= WARMUP - 1, 300, "warm-up")
            first, cpu0 = app.summaries[-1], _cpu_s(procs)
            await wait_for(lambda: app.summaries[-1].iteration >= first.iteration + iterations, 600, "iterations")
            last, cpu1 = app.summaries[-1], _cpu_s(procs)
            durations = [s.duration_s for s in app.summaries if first.iteration < s.iteration <= last.iteration]
            n = last.iteration - first.iteration
            checks = app.bans.counts
            return {"s_per_iteration": (last.finished_at - first.finished_at) / n,
                    "median_duration_s": statistics.median(durations), "cpu_s_per_iteration": (cpu1 - cpu0) / n,
                    "passed": checks["passed"], "failed": checks["failed"], "iterations": n}
        finally:
            stop_processes(procs)


def swarm_overhead(rate: float, iterations: int = 15, repeats: int = 1) -> dict:
    """Checks at `rate` against none, `repeats` times each, alternated; overhead of the best of
    each side (a loaded machine only ever adds time)."""
    on, off = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for side, rate_now in ((off, 0.0), (on, rate)):
                start = time.monotonic()
                side.append(asyncio.run(_measure(rate_now, iterations, Path(tmp) / f"{r}-{rate_now}")))
                side[-1]["took_s"] = time.monotonic() - start
    best = lambda runs, key: min(x[key] for x in runs)  # noqa: E731
    return {"on": on, "off": off,
            "wall_pct": 100 * (best(on, "s_per_iteration") / best(off, "s_per_iteration") - 1),
            "cpu_pct": 100 * (best(on, "cpu_s_per_iteration") / best(off, "cpu_s_per_iteration") - 1)}
