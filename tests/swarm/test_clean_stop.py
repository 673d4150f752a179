"""Clean stops (issue 23): SIGINT to the process group (a terminal's Ctrl-C) or SIGTERM
(`docker stop`, `timeout`) ends a coordinator, a peer still waiting for its run spec and
`skippipe-swarm` within 5 s, leaving none of the processes they started (p2pd included,
tracked by the pids found under them in /proc, not by name); a second Ctrl-C ends at once.

Every process starts at once, in its own session, and is signalled when it reports ready.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
STOP_S = 5.0


def children_tree() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


class Proc:
    def __init__(self, name: str, *args: str):
        self.name, self.lines, self.changed = name, [], threading.Condition()
        self.p = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            with self.changed:
                self.lines.append(line.rstrip())
                self.changed.notify_all()

    def wait_line(self, pattern: str, timeout: float = 90) -> re.Match:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    if m := re.search(pattern, line):
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.p.poll() is not None:
                    raise AssertionError(f"{self.name}: no line matching {pattern!r}; output:\n" + self.output())
                self.changed.wait(min(left, 0.5))

    def output(self) -> str:
        return "\n".join(self.lines[-30:])

    def descendants(self) -> list[int]:
        tree, out, todo = children_tree(), [], [self.p.pid]
        while todo:
            kids = [k for k in tree.get(todo.pop(), []) if alive(k)]
            out += kids
            todo += kids
        return out

    def wait_p2pds(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while sum(command(d) == "p2pd" for d in self.descendants()) < count:
            assert time.monotonic() < deadline and self.p.poll() is None, f"{self.name}: no p2pd\n{self.output()}"
            time.sleep(0.2)

    def signal_and_wait(self, sig: int, again: bool = False, within: float = STOP_S) -> float:
        """Send `sig` to the process group (`again`: a second time once the first is taken,
        as a person presses Ctrl-C twice; two at once merge into one); seconds until it and
        everything under it is gone."""
        started = self.descendants()
        assert any(command(d) == "p2pd" for d in started), f"{self.name}: no p2pd to watch"
        os.killpg(self.p.pid, sig)
        t0 = time.monotonic()
        if again:
            self.wait_line("again to stop at once", timeout=within)
            t0 = time.monotonic()
            os.killpg(self.p.pid, sig)
        sigs = (sig, sig) if again else (sig,)
        try:
            self.p.wait(timeout=within)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            raise AssertionError(f"{self.name} still running {within}s after {sigs}; output:\n{self.output()}")
        while any(alive(d) for d in started) and time.monotonic() - t0 < within:
            time.sleep(0.05)
        left = {d: command(d) for d in started if alive(d)}
        assert not left, f"{self.name}: left behind {left}"
        return time.monotonic() - t0


def test_sigint_and_sigterm_stop_every_script_within_5s(tmp_path):
    coordinator = ["coordinator.cli", "--status-port", "off", "--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
    stale = tmp_path / "coordinator.maddrs"   # left by a coordinator that crashed (compose reads it)
    stale.write_text("/ip4/127.0.0.1/tcp/1/p2p/12D3KooWS4Lu25p9TxgZAhwHZLN4x3kUmptgqzJLyoiFP89cXYE4\n")
    host = Proc("coordinator (SIGTERM)", *coordinator, "--run", "host", "--maddrs-file", str(stale))
    procs = [host, Proc("coordinator (SIGINT)", *coordinator, "--run", "a"),
             Proc("coordinator (SIGINT twice)", *coordinator, "--run", "b")]
    swarm = ["launcher", "--peers", "1", "--stages", "1", "--steps", "1000", "--log-level", "INFO"]
    swarms = [Proc("skippipe-swarm (SIGINT)", *swarm, "--logs-dir", str(tmp_path / "s1")),
              Proc("skippipe-swarm (SIGTERM)", *swarm, "--logs-dir", str(tmp_path / "s2"))]
    procs += swarms
    try:
        maddrs = host.wait_line(r"--initial-peers (.+)$").group(1).split()
        deadline = time.monotonic() + 30               # written right after that line
        while (not stale.exists() or stale.read_text().split() != maddrs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stale.read_text().split() == maddrs     # the stale one was replaced by this run's
        peer = ["peer.cli", "--initial-peers", *maddrs, "--run", "no-such-run", "--no-benchmark",
                "--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
        peers = [Proc("peer waiting for its spec (SIGINT)", *peer), Proc("peer waiting for its spec (SIGTERM)", *peer)]
        procs += peers
        took = {}

        procs[1].wait_line("Peers join with")
        took[procs[1].name] = procs[1].signal_and_wait(signal.SIGINT)
        procs[2].wait_line("Peers join with")
        took[procs[2].name] = procs[2].signal_and_wait(signal.SIGINT, again=True, within=1.0)
        for s, sig in zip(swarms, (signal.SIGINT, signal.SIGTERM)):
            s.wait_line("coordinator up at")
            s.wait_p2pds(2)   # its own and its peer's: the peer is up
            took[s.name] = s.signal_and_wait(sig)
        for p, sig in zip(peers, (signal.SIGINT, signal.SIGTERM)):
            # a wrong --run says so within seconds, not after a silent minute
            p.wait_line(r"no run spec for run 'no-such-run' found on the DHT yet; waiting .*is --run right\?")
            took[p.name] = p.signal_and_wait(sig)
        took[host.name] = host.signal_and_wait(signal.SIGTERM)
        assert not stale.exists()                      # a stopped coordinator leaves no address behind
        print(took)
    finally:
        for p in procs:
            if p.p.poll() is None:
                os.killpg(p.p.pid, signal.SIGKILL)
                p.p.wait()
