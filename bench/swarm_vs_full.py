"""SkipPipe vs the full pipeline on an emulated geo-distributed network (issue 6).

Writes one geo topology (coordinator/planner/presets.py: 12 cloud regions, RTT from distance,
bandwidth falling with distance), then runs the real local swarm (`skippipe-swarm --topology`:
coordinator + peer processes over hivemind P2P on 127.0.0.1, every send delayed by the link
emulator) twice on it, same model, data, seed and tokens: once with the full pipeline (DT-FM
partition, k = 0) and once with SkipPipe (k = 1/3). The model is tiny, so emulated network
time dominates compute.

Both iterations carry the same tokens: the planner gives stage 0 N / path-length data nodes
(2 for the full pipeline, 3 for SkipPipe with 12 nodes and 6 stages), so each strategy gets
`--microbatches-per-iteration` / its data-node count microbatches per data node (24 in all by
default: 12 per full-pipeline data node, 8 per SkipPipe one). The full pipeline is DT-FM's: its partition gets the same search as SkipPipe's, and
each microbatch rides its data node's pipeline of replicas (coordinator/planner/pipelines.py).

Defaults, and why: 6 stages, so that k = 1/3 skips 2 of 6 stages (with 5 a path keeps
ceil(2/3 * 5) = 4 of them: only 1/5 skipped); 12 nodes (2 per stage). Latencies x1.5
(--latency-scale): here every hop also pays ~30 ms of CPU-bound RPC and task overhead (12
peer processes on 2 shared cores; coordinator/planner/costs.py LOCAL_SWARM_OVERHEADS), some 15x
what a hop costs on dedicated machines, which would otherwise weigh as much as the geography.
Bandwidths x0.02 (--bandwidth-scale): the tiny model's microbatch activation is 64 KiB (4 x 64
tokens x 64 dims, float32), which the preset's 0.08-2 Gbit/s links carry in 0.3-7 ms, so links
would be latency only. The paper's setting is LLaMA models of 500M+ parameters, whose microbatch
activations are megabytes (one 1024-token sample of our 500m config is 2.5 MiB in bfloat16): at
x0.02 our 64 KiB take as long as 3.2 MiB at the real bandwidths (7-330 ms), so transfers weigh
against latency and compute as they do there. The replicas' gradient shares (50-90 KiB per stage
in int8, the peers' default --share-dtype) are scaled alike, which is still far lighter than a
real stage's hundreds of MB.

For each run: the mean iteration time (after `--warmup` iterations) and the coordinator's
prediction for the schedule it published (coordinator/planner/steady.py: the simulated
iteration plus its boundary, in steady state, with the local swarm's overheads, on the
emulated links and the peers' advertised compute), with fidelity = predicted / measured.

  python bench/swarm_vs_full.py [--nodes 12] [--stages 6] [--steps 12] [--microbatches-per-iteration 24]
                                [--latency-scale 1.5] [--bandwidth-scale 0.02] [--topology-seed 2]
Last line: RESULT ratio=<skippipe/full measured> sim_fidelity_full=<..> sim_fidelity_skippipe=<..>
"""
import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coordinator.planner.partition import data_node_count
from coordinator.planner.presets import make_topology
from coordinator.planner.rules import path_length
from protocol.messages import GRADIENT_EXCHANGES, SHARE_DTYPES
from protocol.topology import topology_to_json

DIM, SEQ_LEN, SAMPLES = 64, 64, 4          # the tiny model, as the swarm runs it


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=12, help="peers (one per topology node)")
    p.add_argument("--stages", type=int, default=6)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="first iterations left out of the mean")
    p.add_argument("--microbatches-per-iteration", type=int, default=24,
                   help="microbatches in one iteration, for both strategies (a multiple of both data-node counts)")
    p.add_argument("--topology-seed", type=int, default=2)
    p.add_argument("--latency-scale", type=positive, default=1.5, help="multiply the preset's latencies (see above)")
    p.add_argument("--bandwidth-scale", type=positive, default=0.02, help="multiply the preset's bandwidths (see above)")
    p.add_argument("--share-dtype", choices=SHARE_DTYPES, default=None,
                   help="the peers' --share-dtype (default: theirs)")
    p.add_argument("--gradient-exchange", choices=GRADIENT_EXCHANGES, default=None,
                   help="the run's --gradient-exchange, both strategies (default: the launcher's)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--keep", type=Path, help="keep topology, summaries and logs in this folder")
    p.add_argument("--log-level", default="WARNING", help="the swarm's log level (DEBUG: per-peer step times)")
    return p.parse_args()


def write_topology(args, path: Path) -> None:
    topo = make_topology("geo", args.nodes, random.Random(args.topology_seed), stages=args.stages, layers=6,
                         microbatch_samples=SAMPLES, microbatches=4,   # the swarm passes its own count
                         activation_bytes=SEQ_LEN * DIM * 4, memory=8)
    lat = tuple(tuple(round(v * args.latency_scale, 3) for v in row) for row in topo.links.latency_ms)
    bw = tuple(tuple(v * args.bandwidth_scale for v in row) for row in topo.links.bandwidth_gib_s)
    topo = dataclasses.replace(topo, links=dataclasses.replace(topo.links, latency_ms=lat, bandwidth_gib_s=bw))
    path.write_text(topology_to_json(topo))


def microbatches_per_data_node(args, skip_ratio: float) -> int:
    """Each strategy's share of --microbatches-per-iteration per data node (same tokens per iteration)."""
    data_nodes = data_node_count(args.nodes, args.stages, path_length(args.stages, skip_ratio), 0, 0)
    total = args.microbatches_per_iteration
    if total % data_nodes:
        raise SystemExit(f"--microbatches-per-iteration {total} does not split over {data_nodes} data nodes "
                         f"(k={skip_ratio:.3g}); use a multiple of {data_nodes}")
    return total // data_nodes


def run_swarm(args, topology: Path, folder: Path, strategy: str, skip: str, microbatches: int,
              extra: tuple[str, ...] = (), label: str = "") -> dict:
    """One swarm run; `extra`: more skippipe-swarm flags, `label`: its name (default: the strategy)."""
    label = label or strategy
    summary = folder / f"{label}.json"
    cmd = [sys.executable, "-m", "launcher", "--topology", str(topology), "--stages", str(args.stages),
           "--steps", str(args.steps), "--strategy", strategy, "--skip", skip, "--model", "tiny",
           "--microbatches", str(microbatches), "--microbatch-samples", str(SAMPLES),
           "--seq-len", str(SEQ_LEN), "--run", f"geo-{label}", "--summary-json", str(summary),
           "--logs-dir", str(folder / f"logs-{label}"), "--timeout", str(args.timeout),
           "--log-level", args.log_level,
           "--announce-period", "5"]   # a shared 2-core box delays adverts: do not mistake that for churn
    if args.share_dtype:
        cmd += ["--share-dtype", args.share_dtype]
    if args.gradient_exchange:
        cmd += ["--gradient-exchange", args.gradient_exchange]
    cmd += list(extra)
    print(f"== {label} (k={skip}): {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, timeout=args.timeout + 120)
    if proc.returncode != 0 or not summary.exists():
        raise SystemExit(f"the {label} swarm failed (exit {proc.returncode}); logs in {folder}")
    data = json.loads(summary.read_text())
    times = [r["duration_s"] for r in data["iterations"][args.warmup:]]
    measured = statistics.mean(times)
    predicted = data["predicted_iteration_s"]
    per_iteration = sum(data["microbatches"].values()) / max(1, data["steps"])
    print(f"   {label}: {len(times)} iterations of {per_iteration:.1f} microbatches measured, mean {measured:.3f}s "
          f"(median {statistics.median(times):.3f}s), simulator {predicted:.3f}s, "
          f"fidelity {predicted / measured:.2f}, lost {data['microbatches']['lost']}, wall {time.monotonic() - t0:.0f}s",
          flush=True)
    return {"measured": measured, "predicted": predicted, "lost": data["microbatches"]["lost"],
            "per_iteration": per_iteration}


def main() -> int:
    args = parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="skippipe-geo-"))
    folder.mkdir(parents=True, exist_ok=True)
    topology = folder / "geo.json"
    write_topology(args, topology)
    # both counts first: a bad --microbatches-per-iteration fails before any swarm runs
    per_full, per_skip = (microbatches_per_data_node(args, k) for k in (0.0, 1 / 3))
    full = run_swarm(args, topology, folder, "full", "0", per_full)
    skip = run_swarm(args, topology, folder, "skippipe", "1/3", per_skip)
    ratio = skip["measured"] / full["measured"]
    print(f"SkipPipe / full iteration time: {ratio:.3f} (simulator says "
          f"{skip['predicted'] / full['predicted']:.3f}); target <= 0.6", flush=True)
    print(f"RESULT ratio={ratio:.3f} sim_fidelity_full={full['predicted'] / full['measured']:.3f} "
          f"sim_fidelity_skippipe={skip['predicted'] / skip['measured']:.3f} "
          f"full_s={full['measured']:.3f} skippipe_s={skip['measured']:.3f} "
          f"unmodelled_full_s={full['measured'] - full['predicted']:.3f} "
          f"unmodelled_skippipe_s={skip['measured'] - skip['predicted']:.3f} "
          f"lost={full['lost'] + skip['lost']} nodes={args.nodes} stages={args.stages} "
          f"microbatches_full={full['per_iteration']:g} microbatches_skippipe={skip['per_iteration']:g} "
          f"latency_scale={args.latency_scale:g} bandwidth_scale={args.bandwidth_scale:g} "
          f"gradient_exchange={args.gradient_exchange or 'default'} load={os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
