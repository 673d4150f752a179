"""opsweb/stopping.py's process bookkeeping (the whole clean stop is tests/swarm/test_clean_stop.py)."""
import os
import subprocess
import sys
import time

import pytest

from opsweb.stopping import descendants, kill_all, run_loop, shutdown_dht

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds children through /proc")


def test_descendants_reach_grandchildren_and_kill_all_ends_them():
    # a child that starts a grandchild, as the DHT child starts p2pd
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        found = descendants()
        grandchildren = descendants(child.pid)
        assert child.pid in found and len(grandchildren) == 1 and grandchildren[0] in found
        kill_all(found)
        child.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(map(alive, found)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(alive, found))
    finally:
        child.kill()
        child.wait()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class FakeDHT:
    """What shutdown_dht needs of hivemind's DHT (a multiprocessing.Process) and records what it did."""

    def __init__(self, pid):
        self.pid, self.calls = pid, []

    def is_alive(self):
        return True

    def terminate(self):
        self.calls.append("terminate")

    def join(self, timeout):
        self.calls.append("join")

    def shutdown(self):
        self.calls.append("shutdown")


def test_a_dht_whose_p2pd_is_gone_is_terminated_not_waited_for():
    lonely = subprocess.Popen(["sleep", "30"])          # no children: its "p2pd" died of the Ctrl-C
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                               "subprocess.Popen(['sleep', '30']); print('up', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "up"
        gone, healthy = FakeDHT(lonely.pid), FakeDHT(parent.pid)
        shutdown_dht(gone)
        shutdown_dht(healthy)
        assert gone.calls == ["terminate", "join"] and healthy.calls == ["shutdown"]
    finally:
        for p in (lonely, parent):
            kill_all(descendants(p.pid))
            p.kill()
            p.wait()


def test_run_loop_uses_uvloop_unless_asked_not_to(monkeypatch):
    pytest.importorskip("uvloop")
    import asyncio

    async def loop_module():
        return type(asyncio.get_running_loop()).__module__

    assert run_loop(loop_module()).startswith("uvloop")
    assert run_loop(loop_module(), "asyncio").startswith("asyncio")
    monkeypatch.setenv("SKIPPIPE_EVENT_LOOP", "asyncio")
    assert run_loop(loop_module()).startswith("asyncio")
