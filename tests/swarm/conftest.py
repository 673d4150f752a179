"""Swarm tests: real hivemind DHT + P2P on 127.0.0.1, peers as subprocesses.

Every test, and every module (for swarms a module's tests share), checks that it leaves no
p2pd daemon or peer process behind. Only processes of this test session count: they inherit
SESSION_TAG in their environment, so other swarms on the same machine (a developer's, another
test run's) neither fail these checks nor hide a leak.
"""
import os
import subprocess
import time
from pathlib import Path

import pytest

SESSION_TAG = f"SKIPPIPE_TEST_SESSION={os.getpid()}"
os.environ["SKIPPIPE_TEST_SESSION"] = str(os.getpid())   # inherited by peers, DHT children, p2pd


def pytest_collection_modifyitems(items):
    """Everything under tests/swarm is a multi-process (or real-P2P) test: `slow`, whether or not
    its module says so, so that `-m "not slow"` is the fast loop it claims to be. (Under
    `-n 2 --dist loadgroup` they also run one after another on one worker: tests/conftest.py.)"""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


def _ours(pid: int) -> bool:
    try:
        return SESSION_TAG.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:      # gone meanwhile, or not ours to read
        return False


def _pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {pid for pid in map(int, out.split()) if _ours(pid)}


def _our_fork_server(pid: int) -> bool:
    """This test process's fork server for peers (launcher/fork_server.py): it preloads peer.cli,
    so pgrep finds it, but it lives as long as this process, as multiprocessing's does."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent == os.getpid() and b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _processes() -> set[int]:
    return {pid for pid in _pids("p2pd") | _pids("peer.cli") | _pids("coordinator.cli") if not _our_fork_server(pid)}


def _assert_none_left(before: set[int], groups: set[int] = frozenset(), timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {pid for pid in _processes() - before if _group(pid) not in groups}
        if not left:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"processes left behind: {sorted(left)}")
        time.sleep(0.25)


@pytest.fixture(autouse=True, scope="module")
def no_leftover_processes_per_module():
    before = _processes()
    yield
    _assert_none_left(before)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = _processes()
    # a module's shared swarm is up by now: its peers' process groups (their DHT child and p2pd
    # come later) are not this test's leak; the module's own check covers them
    groups = {_group(pid) for pid in before} - {None, os.getpgid(0)}
    yield
    _assert_none_left(before, groups)
