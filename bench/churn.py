"""Churn benchmark (issue 5): kill a third of the non-stage-0 peers during one iteration.

Runs the real local swarm (`skippipe-swarm`, coordinator + peer processes on 127.0.0.1) with
`--chaos`: with 9 peers on 3 stages, peers 1 (stage 1, killed mid-forward) and 5 (stage 2,
killed mid-backward) die by SIGKILL in the same iteration. Reports whether that iteration
completed, how many microbatches were lost (every one is accounted: completed, rerouted,
skipped-stage, reissued or lost), how many iterations it took to get back to a normal
iteration time (median of the iterations before the fault, x1.5), and how long after the
fault the coordinator published a new schedule without the dead peers.

  python bench/churn.py [--peers 9] [--stages 3] [--steps 14] [--fault-iteration 4]
Last line: RESULT killed=<n> iterations_completed=<n> lost=<n> recovery_iterations=<n> ...
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=int, default=9)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--fault-iteration", type=int, default=4)
    p.add_argument("--timeout", type=float, default=600)
    return p.parse_args()


def victims(peers: int, stages: int) -> list[tuple[int, str]]:
    """A third of the non-stage-0 peers (peer i hosts stage i mod stages), alternating
    between dying mid-forward and mid-backward."""
    middle = [i for i in range(peers) if i % stages != 0]
    count = max(1, len(middle) // 3)
    picked = [middle[(k * len(middle)) // count] for k in range(count)]
    return [(p, "forward" if k % 2 == 0 else "backward") for k, p in enumerate(picked)]


def recovery_iterations(rows: list[dict], fault: int) -> int | None:
    """Iterations from the fault until the first one back at a normal duration."""
    before = [r["duration_s"] for r in rows if r["iteration"] < fault and r["iteration"] > 0]
    if not before:
        return None
    normal = 1.5 * statistics.median(before)
    for r in rows:
        if r["iteration"] > fault and r["duration_s"] <= normal:
            return r["iteration"] - fault
    return None


def main() -> int:
    args = parse_args()
    killed = victims(args.peers, args.stages)
    chaos = ",".join(f"kill:{p}@iter{args.fault_iteration}:{when}" for p, when in killed)
    with tempfile.TemporaryDirectory(prefix="churn-bench-") as tmp:
        out = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "launcher", "--peers", str(args.peers), "--stages",
               str(args.stages), "--steps", str(args.steps), "--skip", "1/3", "--chaos", chaos,
               "--summary-json", str(out), "--timeout", str(args.timeout)]
        print("running:", " ".join(cmd[2:]), flush=True)
        rc = subprocess.run(cmd, timeout=args.timeout + 60).returncode
        if not out.exists():
            print(f"the swarm wrote no summary (exit {rc})")
            print(f"RESULT killed={len(killed)} iterations_completed=0 lost=-1 recovery_iterations=-1")
            return 1
        summary = json.loads(out.read_text())
    rows = summary["iterations"]
    by_iter = {r["iteration"]: r for r in rows}
    fault_row = by_iter.get(args.fault_iteration)
    per_iteration = summary["microbatches"]
    expected = sum(r["completed"] + r["rerouted"] + r["skipped_stage"] + r["reissued"] + r["lost"] for r in rows)
    planned = len(rows) * (rows[0]["completed"] + rows[0]["rerouted"] + rows[0]["skipped_stage"]
                           + rows[0]["reissued"] + rows[0]["lost"]) if rows else 0
    recovery = recovery_iterations(rows, args.fault_iteration)
    replans = [r for r in summary["replans"] if fault_row and r["published_at"] > fault_row["started_at"]]
    replan_s = replans[0]["published_at"] - fault_row["started_at"] if replans else None
    print(f"killed {len(killed)} peer(s) {killed} during iteration {args.fault_iteration}")
    for r in rows:
        mark = " <- fault" if r["iteration"] == args.fault_iteration else ""
        print(f"  iter {r['iteration']:3d} epoch {r['epoch']} {r['duration_s']:6.2f}s loss {r['loss']:.3f} "
              f"completed {r['completed']} rerouted {r['rerouted']} skipped {r['skipped_stage']} "
              f"reissued {r['reissued']} lost {r['lost']}{mark}")
    print(f"microbatches: {per_iteration} (accounted {expected} of {planned} planned)")
    print(f"fault iteration completed: {fault_row is not None}; recovery iterations: {recovery}; "
          f"new schedule published {replan_s if replan_s is None else round(replan_s, 2)} s after the fault "
          f"iteration started; loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}")
    unaccounted = planned - expected
    print(f"RESULT killed={len(killed)} iterations_completed={len(rows)} lost={per_iteration['lost'] + unaccounted} "
          f"recovery_iterations={-1 if recovery is None else recovery} "
          f"replan_s={-1 if replan_s is None else round(replan_s, 2)} exit={rc}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
