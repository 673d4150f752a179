"""Start a coordinator and peers inside network namespaces (bench/netns.py's Hosts) and read the
coordinator's iteration lines: for bench/multihost.py and tests/swarm/test_netns.py."""
import re
import sys
import time
from pathlib import Path

from bench.netns import Hosts

ITERATION = re.compile(r"^iteration (\d+): loss ([\d.]+|nan).*completed=(\d+) rerouted=(\d+) "
                       r"skipped_stage=(\d+) reissued=(\d+) lost=(\d+)", re.M)


def start_coordinator(hosts: Hosts, i: int, tmp_path: Path, *extra: str) -> Path:
    """Start the coordinator in host i; returns its maddrs file (written once it is up)."""
    maddrs = tmp_path / "coordinator.maddrs"
    hosts.popen(i, [sys.executable, "-u", "-m", "coordinator.cli", "run", "--run", "t",
                    "--host-maddrs", f"/ip4/{hosts.addrs[i]}/tcp/0", "--maddrs-file", str(maddrs),
                    "--status-port", "off", "--microbatch-samples", "2", "--seq-len", "32",
                    "--microbatches", "2", *extra], tmp_path / "coordinator.log")
    return maddrs


def wait_maddrs(path: Path, timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().split():
            return path.read_text().split()
        time.sleep(0.25)
    raise AssertionError(f"the coordinator wrote no maddrs file within {timeout:.0f}s")


def start_peer(hosts: Hosts, i: int, tmp_path: Path, maddrs: list[str], stage: int, *extra: str):
    return hosts.popen(i, [sys.executable, "-m", "peer.cli", "--initial-peers", *maddrs, "--run", "t",
                           "--device", "cpu", "--host-maddrs", f"/ip4/{hosts.addrs[i]}/tcp/0",
                           "--cache-dir", str(tmp_path / "cache"), "--stage", str(stage), *extra],
                       tmp_path / f"peer{i}.log")


def iterations(log: Path) -> list[dict]:
    text = log.read_text() if log.exists() else ""
    keys = ("iteration", "loss", "completed", "rerouted", "skipped_stage", "reissued", "lost")
    return [dict(zip(keys, (int(m[0]), float(m[1]), *map(int, m[2:])))) for m in ITERATION.findall(text)]


def wait_iterations(log: Path, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = iterations(log)
        if len(rows) >= count:
            return rows
        time.sleep(0.5)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"{count} iterations not reached in {timeout:.0f}s; coordinator log:\n{tail}")
