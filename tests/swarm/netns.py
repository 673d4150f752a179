"""A pytest fixture for swarms across network namespaces (issue 9), and helpers that read a
namespaced swarm's status and links. Starting the coordinator and peers inside the namespaces
and reading its iteration lines: bench/support/netns_swarm.py (bench/multihost.py uses them too)."""
import json
import subprocess
import sys
import time

import pytest

from bench.netns import Hosts, unavailable_reason


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


def wait_log(path, text: str, timeout: float, poll_s: float = 0.5) -> str:
    """The log at `path` once it contains `text`; fails with its tail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    log = ""
    while time.monotonic() < deadline:
        log = path.read_text() if path.exists() else ""
        if text in log:
            return log
        time.sleep(poll_s)
    raise AssertionError(f"{text!r} not in {path.name} within {timeout:.0f}s:\n{log[-3000:]}")
