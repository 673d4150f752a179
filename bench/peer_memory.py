"""Peer memory against its activation budget (issue 4), used by bench/swarm.py.

A real two-stage swarm (in-process coordinator, peer subprocesses over hivemind P2P on
127.0.0.1) trains with many large microbatches per iteration, so without a bound a peer would
stash all of them for backward. Run side by side with a small and a large --max-activations:
- baseline: each peer's RSS once the model is built (sampled when the first schedule appears);
- growth: peak RSS (VmHWM) minus baseline: gradients, AdamW state, stashed activations, logits;
- budget: what peer/compute/device.py's stage_budget allows for that --max-activations, minus
  the weights already in the baseline.
The bound holds when growth <= budget for the small setting; the large one shows that the
setting, not luck, is what bounds it.
"""
import asyncio
import time
from pathlib import Path

from peer.compute.device import stage_budget
from peer.compute.model import count_parameters, get_config
from bench.support.harness import coordinator, peers, wait_for

MODEL = "tiny"
STAGES = 2
SAMPLES, SEQ_LEN, MICROBATCHES = 8, 128, 12
MB = 1024 * 1024


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def budget_growth_bytes(stage: int, max_activations: int) -> int:
    """The stage's budget beyond the fp32 weights (which the baseline already holds)."""
    cfg = get_config(MODEL)
    layers = cfg.n_layers // STAGES
    origin = stage == 0
    weights = 4 * count_parameters(cfg, layers, with_embed_head=origin)
    return stage_budget(cfg, layers, origin, SAMPLES, SEQ_LEN, max_activations, False) - weights


async def _run(work: Path, max_activations: int, steps: int) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    async with coordinator(num_stages=STAGES, skip_ratio=0.0, min_peers=STAGES, max_steps=steps,
                           microbatch_samples=SAMPLES, seq_len=SEQ_LEN, microbatches_per_origin=MICROBATCHES) as app:
        with peers(app, work, STAGES, "--max-activations", str(max_activations),
                   stages=list(range(STAGES))) as procs:
            await wait_for(lambda: app.schedule is not None, 180, "the first schedule")
            baseline = [_status_kb(p.pid, "VmRSS") * 1024 for p in procs]
            await wait_for(lambda: len(app.summaries) >= steps, 600, f"{steps} iterations")
            peak = [_status_kb(p.pid, "VmHWM") * 1024 for p in procs]
            assert all(s.lost == 0 for s in app.summaries), "microbatches were lost"
    return [dict(stage=s, baseline=b, growth=max(0, pk - b), budget=budget_growth_bytes(s, max_activations))
            for s, (b, pk) in enumerate(zip(baseline, peak))]


def measure(work: Path, small: int = 2, large: int = MICROBATCHES, steps: int = 3) -> dict:
    """Both settings side by side; prints a table and returns the headline figures:
    the worst growth beyond the budget (a fixed runtime overhead if the bound works: allocator
    arenas, the autograd engine, RPC buffers) and the measured cost of one more stashed
    microbatch against the budgeted one (the slope between the two settings)."""
    started = time.monotonic()
    rows = {n: asyncio.run(_run(work / f"act{n}", n, steps)) for n in (small, large)}
    for n, per_stage in rows.items():
        for r in per_stage:
            print(f"--max-activations {n:2d} stage {r['stage']}: baseline {r['baseline'] / MB:6.0f} MB, "
                  f"growth {r['growth'] / MB:6.1f} MB, budget {r['budget'] / MB:6.1f} MB "
                  f"(over by {(r['growth'] - r['budget']) / MB:+6.1f} MB)")
    slopes = [((b["growth"] - a["growth"]) / (large - small), (b["budget"] - a["budget"]) / (large - small))
              for a, b in zip(rows[small], rows[large])]
    measured, budgeted = max(slopes)
    return dict(growth_mb=max(r["growth"] for r in rows[small]) / MB,
                budget_mb=max(r["budget"] for r in rows[small]) / MB,
                overhead_mb=max(r["growth"] - r["budget"] for rs in rows.values() for r in rs) / MB,
                mb_per_activation=measured / MB, budgeted_mb_per_activation=budgeted / MB,
                bounded=all(m <= b for m, b in slopes), seconds=time.monotonic() - started)
