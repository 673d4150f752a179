"""Swarm tests: real hivemind DHT + P2P on 127.0.0.1, peers as subprocesses.

Every test checks that it leaves no p2pd daemon or peer process behind.
"""
import subprocess

import pytest


def _pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = _pids("p2pd") | _pids("peer.cli")
    yield
    import time
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = (_pids("p2pd") | _pids("peer.cli")) - before
        if not left:
            return
        time.sleep(0.25)
    raise AssertionError(f"processes left behind: {sorted(left)}")
