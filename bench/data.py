"""Tokenizing throughput and memory (issue 21): `skippipe-coordinator data` on ~1 GB of text.

Generates --size-mb of text deterministically into a temporary folder (deleted afterwards):
the embedded Shakespeare corpus, its lines shuffled with a seeded RNG per block, written as
64 MB .txt files with every fourth file as .jsonl (one document per 40 lines) so both
readers are exercised. Then runs the real `data` subcommand in a child process with the
shipped BPE tokenizer (or --tokenizer) and reports MB of text per second (wall clock, start
to finished dataset) and the child's peak RSS. Targets: >= 5 MB/s, peak RSS < 1 GB.

  python bench/data.py [--size-mb 1024] [--tokenizer bpe] [--runs 1]
Last line: RESULT mb_per_s=<min over runs> peak_rss_mb=<max over runs> ...
"""
import argparse
import gzip
import json
import os
import random
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


def build_once(inputs: Path, out: Path, tokenizer: str) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB of the child, its summary line)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "coordinator.cli", "data", "--input", str(inputs),
           "--tokenizer", tokenizer, "-o", str(out)]
    start = time.monotonic()
    pid = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(pid.pid, 0)      # this child's own rusage, not all children's
    elapsed = time.monotonic() - start
    summary = pid.stdout.read().strip()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"data command failed (exit {os.waitstatus_to_exitcode(status)})")
    return elapsed, usage.ru_maxrss / 1024, summary


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-data-", dir=args.workdir) as tmp:
        inputs = Path(tmp) / "inputs"
        inputs.mkdir()
        start = time.monotonic()
        total = generate(inputs, args.size_mb, args.seed)
        print(f"generated {total / 1e6:,.0f} MB of text in {len(list(inputs.iterdir()))} files "
              f"({time.monotonic() - start:.0f} s)", flush=True)
        rates, rsss = [], []
        for run in range(args.runs):
            out = Path(tmp) / f"dataset{run}"
            elapsed, rss, summary = build_once(inputs, out, args.tokenizer)
            rates.append(total / 1e6 / elapsed)
            rsss.append(rss)
            print(f"run {run + 1}: {rates[-1]:.2f} MB/s, {elapsed:.1f} s, peak RSS {rss:.0f} MB\n  {summary}",
                  flush=True)
            shutil.rmtree(out)
    spread = f" mb_per_s_max={max(rates):.2f}" if len(rates) > 1 else ""
    print(f"RESULT mb_per_s={min(rates):.2f}{spread} peak_rss_mb={max(rsss):.0f} size_mb={total / 1e6:.0f} "
          f"tokenizer={args.tokenizer} runs={args.runs} cpus={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
