"""Tokenizing throughput and memory (issue 21): `skippipe-coordinator data` on ~1 GB of text.

Generates --size-mb of text deterministically into a temporary folder (deleted afterwards):
the embedded Shakespeare corpus, its lines shuffled with a seeded RNG per block, written as
64 MB .txt files with every fourth file as .jsonl (one document per 40 lines) so both
readers are exercised. Then runs the real `data` subcommand in a child process with the
shipped BPE tokenizer (or --tokenizer) and reports MB of text per second (wall clock, start
to finished dataset) and peak RSS: the sum over the command and its worker processes,
sampled every 0.1 s from /proc. Also MB per CPU-second (the command's and its workers' user +
system time), which does not depend on how busy the machine is: on an idle machine with C
cores, MB/s is about C times that. Targets: >= 5 MB/s, peak RSS < 1 GB.

  python bench/data.py [--size-mb 1024] [--tokenizer bpe] [--runs 1]
Last line: RESULT mb_per_s=<min over runs> peak_rss_mb=<max over runs> ...
"""
import argparse
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE_MB = 64


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=1024, help="text to generate (default: 1024)")
    p.add_argument("--tokenizer", default="bpe", help="byte, bpe or a tokenizer.json (default: bpe)")
    p.add_argument("--runs", type=int, default=1, help="build the dataset this many times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="the data command's --workers (default: its own)")
    p.add_argument("--workdir", default=None, help="parent folder for the temporary data (default: system tmp)")
    return p.parse_args()


def generate(folder: Path, size_mb: int, seed: int) -> int:
    lines = gzip.decompress((ROOT / "peer" / "corpus" / "shakespeare.txt.gz").read_bytes()) \
        .decode("utf-8").splitlines(keepends=True)
    rng, target, written, index = random.Random(seed), size_mb * 1_000_000, 0, 0
    while written < target:
        is_jsonl = index % 4 == 3
        path = folder / f"part_{index:04d}.{'jsonl' if is_jsonl else 'txt'}"
        with open(path, "w", encoding="utf-8") as f:
            size = 0
            while size < min(FILE_MB * 1_000_000, target - written):
                block = lines[:]
                rng.shuffle(block)
                if is_jsonl:
                    for k in range(0, len(block), 40):
                        record = json.dumps({"text": "".join(block[k:k + 40])}, ensure_ascii=False) + "\n"
                        f.write(record)
                        size += len(record.encode("utf-8"))
                else:
                    text = "".join(block)
                    f.write(text)
                    size += len(text.encode("utf-8"))
        written += size
        index += 1
    return written


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (the data command's workers)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue          # exited between listing and reading
    return total / 1024


def children_cpu_s() -> float:
    """CPU seconds of every waited-for descendant (the command and, through it, its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_once(inputs: Path, out: Path, tokenizer: str, workers: int | None) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS MB of the command and its workers together, its summary)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "coordinator.cli", "data", "--input", str(inputs),
           "--tokenizer", tokenizer, "-o", str(out)] + (["--workers", str(workers)] if workers else [])
    start, cpu = time.monotonic(), children_cpu_s()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak = 0.0
    while proc.poll() is None:               # sampled: the sum over processes has no rusage
        peak = max(peak, tree_rss_mb(proc.pid))
        time.sleep(0.1)
    elapsed = time.monotonic() - start
    summary = proc.stdout.read().strip()
    if proc.returncode != 0:
        sys.exit(f"data command failed (exit {proc.returncode})")
    return elapsed, children_cpu_s() - cpu, peak, summary


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-data-", dir=args.workdir) as tmp:
        inputs = Path(tmp) / "inputs"
        inputs.mkdir()
        start = time.monotonic()
        total = generate(inputs, args.size_mb, args.seed)
        print(f"generated {total / 1e6:,.0f} MB of text in {len(list(inputs.iterdir()))} files "
              f"({time.monotonic() - start:.0f} s)", flush=True)
        rates, rsss, cpu_rates = [], [], []
        for run in range(args.runs):
            out = Path(tmp) / f"dataset{run}"
            elapsed, cpu, rss, summary = build_once(inputs, out, args.tokenizer, args.workers)
            rates.append(total / 1e6 / elapsed)
            cpu_rates.append(total / 1e6 / cpu)
            rsss.append(rss)
            print(f"run {run + 1}: {rates[-1]:.2f} MB/s, {elapsed:.1f} s, {cpu:.1f} CPU-s "
                  f"({cpu_rates[-1]:.2f} MB per CPU-second), peak RSS {rss:.0f} MB, load average "
                  f"{os.getloadavg()[0]:.1f}\n  {summary}", flush=True)
            shutil.rmtree(out)
    spread = f" mb_per_s_max={max(rates):.2f}" if len(rates) > 1 else ""
    print(f"RESULT mb_per_s={min(rates):.2f}{spread} peak_rss_mb={max(rsss):.0f} "
          f"mb_per_cpu_s={min(cpu_rates):.2f} size_mb={total / 1e6:.0f} "
          f"tokenizer={args.tokenizer} runs={args.runs} cpus={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
