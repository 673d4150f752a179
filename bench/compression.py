"""Compressed activations on slow links (issue 27): iteration time with --wire-compression auto
against off on the emulated geo network, and the held-out loss at equal tokens for off, int8
and int4.

Speed: bench/swarm_vs_full.py's topology and scales (12 cloud regions, latencies x1.5,
bandwidths x0.02; see its docstring), SkipPipe (k = 1/3) run twice by the real local swarm
(`skippipe-swarm --topology`: coordinator + peer processes over hivemind P2P on 127.0.0.1, every
send delayed by the link emulator for its bytes), same model, data, seed and tokens: once with
`--wire-compression off` (floats) and once with `auto` (the planner quantises, int8, the links
whose float transmission outweighs a stage's compute; coordinator/planner/costs.py). For each:
the mean iteration time after --warmup iterations and the coordinator's prediction.

Convergence: bench/convergence.py's machinery (the real worker and handlers in one process,
in-memory transport; the tiny model on the embedded corpus; SkipPipe k = 1/3 on its
single-cluster topology), once per codec, every link carrying that codec (off: floats), the
same tokens; the held-out loss of the trained model with all stages in order.

  python bench/compression.py [--steps 12] [--repeats 3] [--conv-steps 120] [--skip-speed] [--skip-convergence]
  [--conv-codecs off,int8,int4[,jitter]]
The jitter codec is a control: floats off by ~1e-5 (bench/support/wire_jitter.py),
far closer to exact than any codec; the tiny model's held-out loss moves with it about as much as with
int8 (chaos), which says how much of a codec's figure is the codec.
Last line: RESULT ratio=<auto/off measured> ratio_min=.. ratio_max=.. (over the pairs) loss_off=.. loss_int8=.. loss_int4=.. loss_jitter=..
int8_pct_se=.. int4_pct_se=.. (the standard error of the per-seed % against off) ...
"""
import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.convergence import train  # noqa: E402
from bench.support.wire_jitter import jittered_floats  # noqa: E402
from bench.swarm_vs_full import microbatches_per_data_node, positive, run_swarm, write_topology  # noqa: E402
from peer.data import TextDataset, load_corpus  # noqa: E402

CODECS = ("off", "int8", "int4")
CONTROL = "jitter"      # floats off by ~1e-5 (bench/support/wire_jitter.py): the chaos control


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("speed (bench/swarm_vs_full.py's geo bench)")
    g.add_argument("--nodes", type=int, default=12)
    g.add_argument("--stages", type=int, default=6)
    g.add_argument("--steps", type=int, default=12)
    g.add_argument("--warmup", type=int, default=2, help="first iterations left out of the mean")
    g.add_argument("--microbatches-per-iteration", type=int, default=24)
    g.add_argument("--topology-seed", type=int, default=2)
    g.add_argument("--latency-scale", type=positive, default=1.5)
    g.add_argument("--bandwidth-scale", type=positive, default=0.02)
    g.add_argument("--repeats", type=int, default=1,
                   help="off/auto pairs, run alternately (each pair's ratio is printed; the ratio is of "
                        "the means): one pair's ratio moves by ~0.1 with the machine's load")
    g.add_argument("--timeout", type=float, default=600)
    g.add_argument("--log-level", default="WARNING")
    g.add_argument("--skip-speed", action="store_true", help="only the convergence part")
    g = p.add_argument_group("convergence (bench/convergence.py)")
    g.add_argument("--conv-steps", type=int, default=120)
    g.add_argument("--conv-stages", type=int, default=5)
    g.add_argument("--conv-nodes", type=int, default=10)
    g.add_argument("--conv-seeds", type=int, default=1,
                   help="seeds (model init, data order, plan) per codec; the losses are their means "
                        "(one run's held-out loss moves by ~0.5%% with float arrival order alone)")
    g.add_argument("--conv-first-seed", type=int, default=0,
                   help="the first of the --conv-seeds seeds (default 0): another range gives runs "
                        "independent of earlier ones, not the same seeds again")
    g.add_argument("--conv-codecs", default=",".join(CODECS),
                   help="what every link carries in the convergence runs, comma-separated (off first; "
                        f"default %(default)s; {CONTROL}: floats off by ~1e-5, the control for chaos)")
    g.add_argument("--skip-convergence", action="store_true", help="only the speed part")
    p.add_argument("--keep", type=Path, help="keep topology, summaries, logs and checkpoints in this folder")
    args = p.parse_args()
    if args.conv_first_seed < 0 or args.conv_seeds < 1:
        p.error("--conv-first-seed must be >= 0 and --conv-seeds >= 1")
    args.conv_codecs = tuple(args.conv_codecs.split(","))
    if args.conv_codecs[0] != "off" or not set(args.conv_codecs) <= set(CODECS + (CONTROL,)):
        p.error(f"--conv-codecs: off first, then some of {CODECS[1:] + (CONTROL,)}")
    args.share_dtype = None   # the swarm's: the peers' default
    args.gradient_exchange = None   # the launcher's (sync)
    return args


def speed(args, folder: Path) -> dict:
    topology = folder / "geo.json"
    write_topology(args, topology)
    per_node = microbatches_per_data_node(args, 1 / 3)
    pairs = []
    for r in range(max(1, args.repeats)):
        suffix = f"-r{r}" if args.repeats > 1 else ""
        pairs.append({mode: run_swarm(args, topology, folder, "skippipe", "1/3", per_node,
                                      extra=("--wire-compression", mode), label=f"skippipe-{mode}{suffix}")
                      for mode in ("off", "auto")})
        print(f"pair {r}: auto / off {pairs[-1]['auto']['measured'] / pairs[-1]['off']['measured']:.3f}", flush=True)
    mean = {mode: statistics.mean(p[mode]["measured"] for p in pairs) for mode in ("off", "auto")}
    predicted = {mode: statistics.mean(p[mode]["predicted"] for p in pairs) for mode in ("off", "auto")}
    each = [p["auto"]["measured"] / p["off"]["measured"] for p in pairs]
    ratio = mean["auto"] / mean["off"]
    print(f"SkipPipe auto / off iteration time: {ratio:.3f} ({mean['off']:.3f} s -> {mean['auto']:.3f} s; pairs "
          f"{min(each):.3f}-{max(each):.3f}; simulator {predicted['off']:.3f} s -> {predicted['auto']:.3f} s, "
          f"ratio {predicted['auto'] / predicted['off']:.3f}); target <= 0.75", flush=True)
    return {"ratio": ratio, "ratio_min": min(each), "ratio_max": max(each), "off_s": mean["off"],
            "auto_s": mean["auto"], "sim_ratio": predicted["auto"] / predicted["off"],
            "lost": sum(p[mode]["lost"] for p in pairs for mode in ("off", "auto"))}


def convergence(args, folder: Path) -> dict:
    train_set, held = TextDataset(load_corpus()).split()
    held_out = list(held.eval_batches(samples=8, seq_len=64, max_batches=16))
    runs = {c: [] for c in args.conv_codecs}
    for seed in range(args.conv_first_seed, args.conv_first_seed + args.conv_seeds):
        conv = argparse.Namespace(steps=args.conv_steps, stages=args.conv_stages, nodes=args.conv_nodes,
                                  data_nodes=2, microbatches=4, samples=8, seq_len=64, lr=3e-3, seed=seed,
                                  share_dtype="int8")
        for c in args.conv_codecs:
            with jittered_floats() if c == CONTROL else contextlib.nullcontext():
                runs[c].append(train(conv, 1 / 3, train_set, held_out, folder / f"conv-{c}-s{seed}",
                                     wire_compression="int8" if c == CONTROL else c))
    if len({r["tokens"] for rs in runs.values() for r in rs}) != 1:
        raise SystemExit("the convergence runs saw different numbers of tokens")
    loss = {c: sum(r["held_out_loss"] for r in rs) / len(rs) for c, rs in runs.items()}
    spread = {}
    for c, rs in runs.items():
        quantised = sum(r["sent"]["int8"] + r["sent"]["int4"] for r in rs)
        total = quantised + sum(r["sent"]["off"] for r in rs)
        each = " ".join(f"{r['held_out_loss']:.4f}" for r in rs)
        print(f"wire {c}: held-out loss {loss[c]:.4f} (seeds: {each}; "
              f"{100 * (loss[c] / loss['off'] - 1):+.2f}% vs off), {quantised} of {total} tensors sent quantised",
              flush=True)
        if c != "off":
            spread[c] = paired_pct(runs["off"], rs)
            print(f"wire {c}: per seed vs off {' '.join(f'{x:+.1f}%' for x in spread[c]['each'])}; their mean "
                  f"{spread[c]['mean']:+.2f}%, standard error {spread[c]['se']:.2f}% over {len(rs)} seeds", flush=True)
    print("targets: int8 within 1%, int4 within 3% of off", flush=True)
    if CONTROL in loss:
        for c in set(loss) & set(CODECS[1:]):
            print(f"wire {c} vs the {CONTROL} control: {100 * (loss[c] / loss[CONTROL] - 1):+.2f}%", flush=True)
    return loss | {"tokens": runs["off"][0]["tokens"]} | {f"{c}_se": v["se"] for c, v in spread.items()}


def paired_pct(off: list[dict], other: list[dict]) -> dict:
    """Each seed's held-out loss against the floats run of the same seed (%), their mean and its
    standard error: how far a mean over these seeds can be trusted (the seeds spread by several %)."""
    each = [100 * (o["held_out_loss"] / f["held_out_loss"] - 1) for f, o in zip(off, other)]
    se = statistics.stdev(each) / math.sqrt(len(each)) if len(each) > 1 else math.nan
    return {"each": each, "mean": statistics.mean(each), "se": se}


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="skippipe-compression-"))
    folder.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} CPUs)", flush=True)
    fast = {} if args.skip_speed else speed(args, folder)
    loss = {} if args.skip_convergence else convergence(args, folder)
    end = os.getloadavg()
    print(f"load average at end: {end[0]:.1f} {end[1]:.1f} {end[2]:.1f}", flush=True)

    def fmt(value, spec=".4f"):
        return "nan" if value is None else format(value, spec)
    print(f"RESULT ratio={fmt(fast.get('ratio'), '.3f')} ratio_min={fmt(fast.get('ratio_min'), '.3f')} "
          f"ratio_max={fmt(fast.get('ratio_max'), '.3f')} loss_off={fmt(loss.get('off'))} "
          f"loss_int8={fmt(loss.get('int8'))} loss_int4={fmt(loss.get('int4'))} "
          f"loss_{CONTROL}={fmt(loss.get(CONTROL))} int8_pct_se={fmt(loss.get('int8_se'), '.2f')} "
          f"int4_pct_se={fmt(loss.get('int4_se'), '.2f')} "
          f"off_s={fmt(fast.get('off_s'), '.3f')} auto_s={fmt(fast.get('auto_s'), '.3f')} "
          f"sim_ratio={fmt(fast.get('sim_ratio'), '.3f')} lost={fast.get('lost', 0)} "
          f"tokens={loss.get('tokens', 0)} load_start={load[0]:.1f} load_end={end[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
