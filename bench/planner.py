"""Planner benchmark: simulated iteration time of full / random-skip / skippipe per preset
(20 nodes, 6 stages, k = 1/3), then the planner's wall time at 50, 100 and 200 nodes.

    .venv/bin/python bench/planner.py [--seed S]
Last line: RESULT geo_ratio=<skippipe/full> plan_s_20=<s> plan_s_200=<s>
"""
import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.planner import PlanConfig, plan, simulate, validate  # noqa: E402
from coordinator.planner.presets import PRESETS, make_topology  # noqa: E402

SKIP = 1.0 / 3.0


def _timed_plan(topo, strategy, seed):
    t0 = time.perf_counter()
    schedule = plan(topo, PlanConfig(strategy=strategy, skip_ratio=SKIP), seed)
    return schedule, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"{'preset':9} {'full s':>8} {'random s':>9} {'skippipe s':>11} {'skip/full':>10} "
          f"{'plan s':>7} {'violations':>10}")
    geo_ratio, plan_20 = 0.0, 0.0
    for preset in PRESETS:
        topo = make_topology(preset, 20, random.Random(args.seed))
        times = {}
        for strategy in ("full", "random-skip", "skippipe"):
            schedule, wall = _timed_plan(topo, strategy, args.seed)
            times[strategy] = simulate(schedule, topo).iteration_time_s
        violations = len(validate(schedule, topo))
        ratio = times["skippipe"] / times["full"]
        if preset == "geo":
            geo_ratio, plan_20 = ratio, wall
        print(f"{preset:9} {times['full']:8.2f} {times['random-skip']:9.2f} {times['skippipe']:11.2f} "
              f"{ratio:10.3f} {wall:7.2f} {violations:10d}")
    print(f"\n{'nodes':>5} {'plan s':>7} {'skippipe s':>11}")
    plan_200 = 0.0
    for n in (50, 100, 200):
        topo = make_topology("geo", n, random.Random(args.seed))
        schedule, wall = _timed_plan(topo, "skippipe", args.seed)
        plan_200 = wall
        print(f"{n:5d} {wall:7.2f} {schedule.predicted_iteration_s:11.2f}")
    print(f"RESULT geo_ratio={geo_ratio:.3f} plan_s_20={plan_20:.2f} plan_s_200={plan_200:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
