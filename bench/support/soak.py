"""Launching the rogue (bench/support/rogue.py) as its own process, and reading a process's memory:
for the hostile soak in tests/swarm/test_shared_swarm.py and bench/hostile.py."""
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_rogue(maddrs, run, duration_s, rate, log_path, count=0) -> subprocess.Popen:
    log = open(log_path, "wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "bench.support.rogue", "--initial-peers", *maddrs, "--run", run,
                                 "--duration", str(duration_s), "--rate", str(rate), "--count", str(count)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def stop_rogue(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: its DHT child and p2pd too
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
