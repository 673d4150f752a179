"""A pytest fixture for swarms across network namespaces (issue 9), and helpers to start the
coordinator and peers inside them and read the coordinator's iteration lines."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.netns import Hosts, unavailable_reason

ITERATION = re.compile(r"^iteration (\d+): loss ([\d.]+|nan).*completed=(\d+) rerouted=(\d+) "
                       r"skipped_stage=(\d+) reissued=(\d+) lost=(\d+)", re.M)


def _hosts_factory():
    """make(n) -> Hosts; all of them are torn down after the fixture's scope, pass or fail."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    made: list[Hosts] = []

    def make(count: int) -> Hosts:
        hosts = Hosts(count)
        made.append(hosts)
        hosts.create()
        return hosts
    try:
        yield make
    finally:
        for hosts in made:
            hosts.close()


@pytest.fixture
def make_hosts():
    """make_hosts(n) -> Hosts, for one test."""
    yield from _hosts_factory()


@pytest.fixture(scope="module")
def make_module_hosts():
    """make_module_hosts(n) -> Hosts, for a swarm that a module's tests share."""
    yield from _hosts_factory()


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


def status(hosts: Hosts, i: int, port: int) -> dict:
    """The coordinator's /api/status, fetched from inside its own namespace (its loopback)."""
    code = (f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/api/status', timeout=10).read().decode())")
    proc = subprocess.run(["ip", "netns", "exec", hosts.names[i], sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise AssertionError(f"status fetch failed: {proc.stderr[-500:]}")
    return json.loads(proc.stdout)


def links(hosts: Hosts, i: int, run: str, maddrs: list[str]) -> dict[str, dict[str, float]]:
    """The link records peers published ({reporter: {peer: bytes/s}}), read from host i."""
    proc = subprocess.run(["ip", "netns", "exec", hosts.names[i], sys.executable, "-m", "tests.swarm.read_links",
                           run, *maddrs], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"reading links failed: {proc.stderr[-1000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
