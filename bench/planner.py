"""Planner benchmark (issue 26): how far each strategy's schedule is from its lower bound.

Per topology (the paper's geo setting: 20 nodes of the geo preset, 6 stages, k = 1/3; three
more random great-circle topologies of 20 nodes; one of 200), for SkipPipe and the full
pipeline: the steady period (coordinator/planner/steady.py), the lower bound of the schedule's
partition (coordinator/planner/bound.py), their ratio (the gap), the time per microbatch
(period / microbatches) and the planning wall time (and its CPU seconds, which other work on a
shared machine disturbs less), every strategy at the same global batch
(--batch-per-node x nodes microbatches per iteration, split among its data nodes by speed). The planner is pure CPU work: the
machine's load changes only the planning seconds, which are printed with the load average.

    .venv/bin/python bench/planner.py [--seed S] [--big-nodes 200]
Last line: RESULT geo_gap=<skippipe> geo_ratio=<skippipe/full per microbatch> gap20_max=<skippipe>
    ratio_big=<skippipe/full per microbatch> plan_s_big=<skippipe> ... (big: --big-nodes)
"""
import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.planner import PlanConfig, plan, predict  # noqa: E402
from coordinator.planner.bound import lower_bound  # noqa: E402
from coordinator.planner.presets import make_topology  # noqa: E402

SKIP = 1.0 / 3.0
STRATEGIES = (("skippipe", SKIP), ("full", 0.0))


def measure(topo, strategy: str, skip: float, seed: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    schedule = plan(topo, PlanConfig(strategy=strategy, skip_ratio=skip), seed)
    planning_s, planning_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    period, bound = predict(schedule, topo).period_s, lower_bound(schedule, topo)
    return {"period": period, "bound": bound, "gap": period / bound, "microbatches": len(schedule.routes),
            "per_mb": period / max(1, len(schedule.routes)), "plan_s": planning_s,
            "plan_cpu_s": planning_cpu_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1, help="seed of the paper's geo setting (others: seed+1..+3)")
    ap.add_argument("--big-nodes", type=int, default=200, help="nodes of the large topology (default: 200)")
    ap.add_argument("--batch-per-node", type=float, default=1.5,
                    help="global batch = this x nodes, the same for every strategy (default: 1.5, SkipPipe's "
                         "own choice at 20 nodes; 0: each strategy's own batch)")
    args = ap.parse_args()
    cases = [("geo20 (paper)", 20, args.seed)] + [(f"random20 #{i}", 20, args.seed + i) for i in (1, 2, 3)] \
        + [(f"geo{args.big_nodes}", args.big_nodes, args.seed)]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus; k = 1/3 for skippipe")
    print(f"{'topology':15} {'strategy':9} {'mbs':>4} {'period s':>9} {'bound s':>8} {'gap':>5} "
          f"{'s/mb':>7} {'plan s':>7} {'cpu s':>7}")
    results = {}
    for name, nodes, seed in cases:
        topo = make_topology("geo", nodes, random.Random(seed))
        batch = round(args.batch_per_node * nodes)
        topo = dataclasses.replace(topo, workload=dataclasses.replace(topo.workload, global_batch=batch))
        for strategy, skip in STRATEGIES:
            r = results[name, strategy] = measure(topo, strategy, skip, seed)
            print(f"{name:15} {strategy:9} {r['microbatches']:4d} {r['period']:9.2f} {r['bound']:8.2f} "
                  f"{r['gap']:5.2f} {r['per_mb']:7.3f} {r['plan_s']:7.2f} {r['plan_cpu_s']:7.2f}", flush=True)
        ratio = results[name, "skippipe"]["per_mb"] / results[name, "full"]["per_mb"]
        print(f"{name:15} skippipe / full per microbatch: {ratio:.3f}")
    geo, big = cases[0][0], cases[-1][0]
    ratio = {name: results[name, "skippipe"]["per_mb"] / results[name, "full"]["per_mb"] for name, _, _ in cases}
    gap20 = max(results[name, "skippipe"]["gap"] for name, nodes, _ in cases if nodes == 20)
    print(f"RESULT geo_gap={results[geo, 'skippipe']['gap']:.3f} geo_ratio={ratio[geo]:.3f} "
          f"gap20_max={gap20:.3f} full_geo_gap={results[geo, 'full']['gap']:.3f} ratio_big={ratio[big]:.3f} "
          f"plan_s_big={results[big, 'skippipe']['plan_s']:.2f} full_plan_s_big={results[big, 'full']['plan_s']:.2f} "
          f"plan_cpu_s_big={results[big, 'skippipe']['plan_cpu_s']:.2f} "
          f"full_plan_cpu_s_big={results[big, 'full']['plan_cpu_s']:.2f} "
          f"big_nodes={args.big_nodes} batch_per_node={args.batch_per_node} load={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
