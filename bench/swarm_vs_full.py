"""SkipPipe vs the full pipeline on an emulated geo-distributed network (issue 6).

Writes one geo topology (coordinator/planner/presets.py: 12 cloud regions, RTT from distance,
bandwidth falling with distance), then runs the real local swarm (`skippipe-swarm --topology`:
coordinator + peer processes over hivemind P2P on 127.0.0.1, every send delayed by the link
emulator) twice on it, same model, data and seed: once with the full pipeline (DT-FM
partition, k = 0) and once with SkipPipe (k = 1/3). The geo latencies are kept as they are and
the model is tiny, so emulated network time dominates compute: this keeps the measurement
meaningful on a small, shared CPU box.

For each run: the mean iteration time (after `--warmup` iterations) and the simulator's
prediction for the schedule the coordinator actually published (coordinator/planner/simulate.py
on the emulated links and the peers' advertised compute), with fidelity = predicted / measured.

  python bench/swarm_vs_full.py [--nodes 10] [--stages 5] [--steps 10] [--topology-seed 2]
Last line: RESULT ratio=<skippipe/full measured> sim_fidelity_full=<..> sim_fidelity_skippipe=<..>
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coordinator.planner.presets import make_topology
from protocol.topology import topology_to_json

DIM, SEQ_LEN, SAMPLES = 64, 64, 4          # the tiny model, as the swarm runs it


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=10, help="peers (one per topology node)")
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="first iterations left out of the mean")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--topology-seed", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--keep", type=Path, help="keep topology, summaries and logs in this folder")
    return p.parse_args()


def write_topology(args, path: Path) -> None:
    topo = make_topology("geo", args.nodes, random.Random(args.topology_seed), stages=args.stages, layers=6,
                         microbatch_samples=SAMPLES, microbatches=args.microbatches,
                         activation_bytes=SEQ_LEN * DIM * 4, memory=8)
    path.write_text(topology_to_json(topo))


def run_swarm(args, topology: Path, folder: Path, strategy: str, skip: str) -> dict:
    summary = folder / f"{strategy}.json"
    cmd = [sys.executable, "-m", "coordinator.swarm_cli", "--topology", str(topology), "--stages", str(args.stages),
           "--steps", str(args.steps), "--strategy", strategy, "--skip", skip, "--model", "tiny",
           "--microbatches", str(args.microbatches), "--microbatch-samples", str(SAMPLES),
           "--seq-len", str(SEQ_LEN), "--run", f"geo-{strategy}", "--summary-json", str(summary),
           "--logs-dir", str(folder / f"logs-{strategy}"), "--timeout", str(args.timeout),
           "--announce-period", "5"]   # a shared 2-core box delays adverts: do not mistake that for churn
    print(f"== {strategy} (k={skip}): {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, timeout=args.timeout + 120)
    if proc.returncode != 0 or not summary.exists():
        raise SystemExit(f"the {strategy} swarm failed (exit {proc.returncode}); logs in {folder}")
    data = json.loads(summary.read_text())
    times = [r["duration_s"] for r in data["iterations"][args.warmup:]]
    measured = statistics.mean(times)
    predicted = data["predicted_iteration_s"]
    print(f"   {strategy}: {len(times)} iterations measured, mean {measured:.3f}s "
          f"(median {statistics.median(times):.3f}s), simulator {predicted:.3f}s, "
          f"fidelity {predicted / measured:.2f}, lost {data['microbatches']['lost']}, wall {time.monotonic() - t0:.0f}s",
          flush=True)
    return {"measured": measured, "predicted": predicted, "lost": data["microbatches"]["lost"]}


def main() -> int:
    args = parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="skippipe-geo-"))
    folder.mkdir(parents=True, exist_ok=True)
    topology = folder / "geo.json"
    write_topology(args, topology)
    full = run_swarm(args, topology, folder, "full", "0")
    skip = run_swarm(args, topology, folder, "skippipe", "1/3")
    ratio = skip["measured"] / full["measured"]
    print(f"SkipPipe / full iteration time: {ratio:.3f} (simulator says "
          f"{skip['predicted'] / full['predicted']:.3f}); target <= 0.6", flush=True)
    print(f"RESULT ratio={ratio:.3f} sim_fidelity_full={full['predicted'] / full['measured']:.3f} "
          f"sim_fidelity_skippipe={skip['predicted'] / skip['measured']:.3f} "
          f"full_s={full['measured']:.3f} skippipe_s={skip['measured']:.3f} "
          f"unmodelled_full_s={full['measured'] - full['predicted']:.3f} "
          f"unmodelled_skippipe_s={skip['measured'] - skip['predicted']:.3f} "
          f"lost={full['lost'] + skip['lost']} nodes={args.nodes} stages={args.stages}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
