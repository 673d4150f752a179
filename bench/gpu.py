"""GPU benchmark, one prepared run (< 8 min on one H200): the peer's real compute path
(StageRunner, bf16 autocast, fp32 master weights, pinned host I/O in the wire dtype).

1. Per-stage forward+backward throughput (tokens/s) and peak memory of the paper's ~500M and
   ~1.5B configs split into 6 stages; each stage holds --depth microbatches before backward,
   as a pipeline stage does. Peak memory is compared with peer.compute.device's estimate.
2. A 4-peer swarm sharing the GPU (real PipelineWorker + WorkHandlers over the in-memory
   transport, so every activation goes through host memory and the wire codec) versus a
   single process running the same 4 stages back to back with tensors kept on the GPU.

    .venv/bin/python bench/gpu.py                         # on a GPU machine (cuda:0)
    .venv/bin/python bench/gpu.py --dry-run               # CPU, tiny model: checks the script
Figures go to --out (default $OUT/gpu or out/gpu): gpu.json and gpu.png.
Last line: RESULT tokens_per_s_500m=<bottleneck stage> swarm_vs_single=<ratio> peak_mem_gb_stage=<max>
"""
import argparse
import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from peer.compute import device as devices  # noqa: E402
from peer.compute import precision  # noqa: E402
from peer.compute.host_buffers import DeviceIO  # noqa: E402
from peer.compute.model import get_config  # noqa: E402
from peer.compute.runner import OptimConfig, StageRunner  # noqa: E402
from peer.compute.stages import build_stage, layer_ranges  # noqa: E402
from peer.pipeline.handlers import WorkHandlers  # noqa: E402
from peer.pipeline.schedule_book import ScheduleBook  # noqa: E402
from peer.pipeline.worker import PipelineWorker, StageSeat, WorkerHooks, WorkerSettings  # noqa: E402
from peer.transport.memory import MemoryNetwork  # noqa: E402
from peer.transport.rpc import RpcClient, RpcServer  # noqa: E402
from protocol import messages as m  # noqa: E402
from bench.support.memory_swarm import batches_for, make_schedule  # noqa: E402


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_memory(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def make_runner(model: str, stage: int, stages: int, dev: torch.device, depth: int,
                prec: precision.Precision, io: bool = True) -> StageRunner:
    return StageRunner(build_stage(get_config(model), stage, stages, 0), OptimConfig(lr=1e-4),
                       max_stash=depth, device=dev, autocast_dtype=prec.autocast,
                       io=DeviceIO(dev, prec) if io else None)


def stage_inputs(r: StageRunner, depth: int, samples: int, seq: int) -> list:
    """What the stage receives, made once (as decoded fp32 host tensors) so the timing is
    the stage's own: host->device copies, compute, device->host copies in the wire dtype."""
    c, g = r.config, torch.Generator().manual_seed(0)
    if r.is_origin:
        return [torch.randint(0, c.vocab_size, (samples, seq), generator=g) for _ in range(depth)]
    return [(torch.randn(samples, seq, c.dim, generator=g),
             torch.randn(samples, seq, c.dim, generator=g) * 1e-3) for _ in range(depth)]


def stage_round(r: StageRunner, it: int, inputs: list) -> None:
    """len(inputs) forwards, then as many backwards, like a pipeline stage's stash."""
    keys = [(it, k) for k in range(len(inputs))]
    if r.is_origin:
        outs = [r.forward_origin(k, t) for k, t in zip(keys, inputs)]
        for k, h, t in zip(keys, outs, inputs):
            _, grad = r.head_loss(k, h.float(), t)
            r.backward_origin(k, grad.float())
    else:
        for k, (x, _) in zip(keys, inputs):
            r.forward(k, x)
        for k, (_, g) in zip(keys, inputs):
            r.backward(k, g)


def bench_stage(model: str, stage: int, stages: int, dev: torch.device, prec, a) -> dict:
    cfg = get_config(model)
    seq = min(a.seq_len, cfg.max_seq_len)
    r = make_runner(model, stage, stages, dev, a.depth, prec)
    inputs = stage_inputs(r, a.depth, a.samples, seq)
    stage_round(r, 0, inputs)                             # warm-up; allocates AdamW state too
    r.step()
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for it in range(1, a.rounds + 1):
        stage_round(r, it, inputs)
        sync(dev)
    elapsed = time.perf_counter() - t0
    r.step()
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    start, end = r.module.layer_start, r.module.layer_end
    est = devices.stage_budget(cfg, end - start, stage == 0, a.samples, seq, a.depth, r.autocast_dtype is not None)
    del r
    free_memory(dev)
    tokens = a.rounds * a.depth * a.samples * seq
    return {"model": model, "stage": stage, "layers": end - start, "tokens_per_s": tokens / elapsed,
            "peak_mem_gb": peak / devices.GIB, "estimate_gb": est / devices.GIB}


# ---- swarm vs single process ----

def swarm_spec(a) -> m.RunSpec:
    cfg = get_config(a.swarm_model)
    return m.RunSpec(run="gpu", model=a.swarm_model, num_stages=a.peers, skip_ratio=0.0,
                     microbatch_samples=a.samples, seq_len=min(a.swarm_seq, cfg.max_seq_len),
                     microbatches_per_origin=a.microbatches, learning_rate=1e-4, warmup_steps=1,
                     max_steps=a.iterations)


def tokens_per_s(finished: list[float], spec: m.RunSpec) -> float:
    """Steady state: iterations after the first (warm-up) over the time they took."""
    per_iter = spec.microbatches_per_origin * spec.microbatch_samples * spec.seq_len
    return per_iter * (len(finished) - 1) / (finished[-1] - finished[0])


async def run_swarm(spec: m.RunSpec, dev: torch.device, depth: int, prec, timeout_s: float = 420) -> float:
    peers = [f"gpu{i}" for i in range(spec.num_stages)]
    stage_of = {p: i for i, p in enumerate(peers)}
    schedule = make_schedule(spec.run, stage_of, {mb: peers for mb in range(spec.microbatches_per_origin)})
    batch, _ = batches_for(spec)
    network, workers = MemoryNetwork(), []
    for peer in peers:
        book = ScheduleBook()
        book.add(schedule)
        transport = network.transport(peer)
        worker = PipelineWorker(peer, spec, RpcClient(transport), book,
                                StageSeat(lambda s: make_runner(spec.model, s, spec.num_stages, dev, depth, prec)),
                                settings=WorkerSettings(max_activations=depth, iteration_timeout_s=300),
                                hooks=WorkerHooks(batch=batch))
        server = RpcServer()

        async def no_refresh():
            return None
        WorkHandlers(worker, no_refresh).register(server)
        await transport.serve(server.handle)
        workers.append(worker)
    try:
        await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), timeout=timeout_s)
    finally:
        for w in workers:
            w.seat.executor.shutdown(wait=True)
    history = workers[0].ledger.history
    if len(history) < 2 or any(o.completed != spec.microbatches_per_origin for o in history):
        raise RuntimeError(f"swarm did not complete every microbatch: {[o.counts for o in history]}")
    return tokens_per_s([o.finished_at for o in history], spec)


def run_single(spec: m.RunSpec, dev: torch.device, depth: int, prec) -> float:
    """The same stages in one process, one after the other, activations left on the device."""
    runners = [make_runner(spec.model, s, spec.num_stages, dev, depth, prec, io=False)
               for s in range(spec.num_stages)]
    batch, _ = batches_for(spec)
    finished = []
    for it in range(spec.max_steps):
        for mb in range(spec.microbatches_per_origin):
            key, (tok, tgt) = (it, mb), batch(it, mb, 0, 1)
            h = runners[0].forward_origin(key, tok)
            for r in runners[1:]:
                h = r.forward(key, h)
            _, g = runners[0].head_loss(key, h, tgt)
            for r in reversed(runners[1:]):
                g = r.backward(key, g)
            runners[0].backward_origin(key, g)
        for r in runners:
            r.step()
        sync(dev)
        finished.append(time.time())
    del runners
    return tokens_per_s(finished, spec)


# ---- driver ----

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--models", nargs="+", default=["500m", "1.5b"])
    ap.add_argument("--stages", type=int, default=6)
    ap.add_argument("--samples", type=int, default=4, help="samples per microbatch")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4, help="microbatches stashed before their backwards")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of --depth microbatches per stage")
    ap.add_argument("--swarm-model", default="500m")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--swarm-seq", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8, help="per swarm iteration")
    ap.add_argument("--iterations", type=int, default=4, help="swarm iterations (the first is warm-up)")
    ap.add_argument("--budget-s", type=float, default=420, help="skip what is left after this long")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")) / "gpu")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny model, few steps, bf16 autocast forced on: checks the script's GPU code path")
    a = ap.parse_args(argv)
    a.autocast = None                  # None: bf16 on CUDA, off on CPU (what a peer does)
    if a.dry_run:
        a.autocast = True
        a.device, a.models, a.swarm_model, a.seq_len, a.swarm_seq = "cpu", ["tiny"], "tiny", 32, 32
        a.samples, a.depth, a.rounds, a.microbatches, a.iterations = 2, 2, 1, 2, 3
    return a


def check(a) -> torch.device:
    dev = devices.parse_device(None, a.device)
    devices.check_device(dev, isolated=False)
    for name in a.models:
        layer_ranges(get_config(name).n_layers, a.stages)      # ValueError: more stages than layers
    layer_ranges(get_config(a.swarm_model).n_layers, a.peers)
    if a.stages < 1 or a.peers < 2 or a.iterations < 2 or min(a.samples, a.depth, a.rounds, a.microbatches) < 1:
        raise ValueError("need --stages >= 1, --peers >= 2, --iterations >= 2 and positive sizes")
    return dev


def write_figures(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for model in report["models"]:
        rows = [r for r in report["stages"] if r["model"] == model]
        axes[0].plot([r["stage"] for r in rows], [r["tokens_per_s"] for r in rows], "o-", label=model)
        axes[1].plot([r["stage"] for r in rows], [r["peak_mem_gb"] for r in rows], "o-", label=model)
    axes[0].set(xlabel="stage", ylabel="tokens/s (fwd+bwd)", title=report["device"])
    axes[1].set(xlabel="stage", ylabel="peak memory (GiB)")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "gpu.png", dpi=120)
    plt.close(fig)


def run_stages(a, dev, prec, report: dict, started: float) -> None:
    """Part 1; a stage that fails (e.g. out of memory) is reported and the run goes on."""
    print(f"{'model':6} {'stage':>5} {'layers':>6} {'tokens/s':>10} {'peak GiB':>9} {'est GiB':>8}")
    for model in a.models:
        for s in range(a.stages):
            if time.perf_counter() - started > a.budget_s:
                print(f"{model:6} {s:>5} skipped: over --budget-s")
                continue
            try:
                row = bench_stage(model, s, a.stages, dev, prec, a)
            except (RuntimeError, ValueError) as exc:     # torch.cuda.OutOfMemoryError is one
                print(f"{model:6} {s:>5} FAILED: {str(exc).splitlines()[0][:200]}")
                free_memory(dev)
                continue
            report["stages"].append(row)
            print(f"{model:6} {s:>5} {row['layers']:>6} {row['tokens_per_s']:>10.0f} "
                  f"{row['peak_mem_gb']:>9.2f} {row['estimate_gb']:>8.2f}", flush=True)


def run_comparison(a, dev, prec, report: dict, started: float) -> None:
    """Part 2: the swarm gets what is left of --budget-s (+60 s), so the run stays bounded."""
    spec = swarm_spec(a)
    try:
        single = run_single(spec, dev, a.depth, prec)
        free_memory(dev)
        left = max(60.0, a.budget_s + 60 - (time.perf_counter() - started))
        swarm = asyncio.run(run_swarm(spec, dev, a.depth, prec, left))
    except (RuntimeError, ValueError, TimeoutError) as exc:
        print(f"swarm vs single FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        return
    finally:
        free_memory(dev)
    report.update(single_tokens_per_s=single, swarm_tokens_per_s=swarm, swarm_vs_single=swarm / single)
    print(f"{a.swarm_model} in {a.peers} stages, {spec.microbatches_per_origin}x{spec.microbatch_samples}x"
          f"{spec.seq_len} tokens/iteration: single process {single:.0f} tokens/s, "
          f"{a.peers}-peer swarm on the same device {swarm:.0f} tokens/s")


def result_line(a, dev, report: dict) -> str:
    """Headline: the first model's bottleneck stage (a pipeline runs at its slowest stage)."""
    def rows(model):
        return [r for r in report["stages"] if r["model"] == model]
    nan = float("nan")
    head = a.models[0]
    tps = min((r["tokens_per_s"] for r in rows(head)), default=nan)
    peak = max((r["peak_mem_gb"] for r in rows(head)), default=nan)
    extra = "".join(f" peak_mem_gb_stage_{mm.replace('.', '_')}="
                    f"{max((r['peak_mem_gb'] for r in rows(mm)), default=nan):.2f}" for mm in a.models[1:])
    return (f"RESULT tokens_per_s_{head.replace('.', '_')}={tps:.0f} "
            f"swarm_vs_single={report.get('swarm_vs_single', nan):.3f} peak_mem_gb_stage={peak:.2f}{extra} "
            f"device={dev.type}")


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        dev = check(a)
    except (devices.DeviceError, ValueError, KeyError) as exc:
        print(f"gpu.py: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    if dev.type == "cpu":
        torch.set_num_threads(1)       # tiny matmuls on a shared box: threads only hurt
    prec = precision.resolve(dev, autocast=a.autocast)
    started, name = time.perf_counter(), (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu")
    print(f"device {dev} ({name}); {prec.describe()}")
    report = {"device": name, "models": a.models, "stages": [], "args": {k: str(v) for k, v in vars(a).items()}}
    run_stages(a, dev, prec, report, started)
    run_comparison(a, dev, prec, report, started)
    report["wall_s"] = time.perf_counter() - started
    write_figures(a.out, report)
    print(f"figures in {a.out}; wall {report['wall_s']:.0f}s")
    print(result_line(a, dev, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
