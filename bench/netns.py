"""Several "hosts" on one machine: Linux network namespaces joined by veth pairs and a bridge.

Host i lives in namespace sp-<tag>-<i> with one veth (vh<tag><i>) and one address in a private
/24 (10.213.<rand>.0/24) that exists only inside these namespaces; the bridge lives in its own
namespace sp-<tag>-br, so the root namespace gets no new address or route. Needs root and
iproute2. Everything is torn down in close() (processes, then namespaces, which takes the veths
with them), also when a test fails. Used by bench/support/netns_swarm.py, bench/multihost.py and
tests/swarm/netns.py.
"""
import ctypes
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


class NetnsError(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class Hosts:
    """N namespaces on one bridge. Use as a context manager."""

    def __init__(self, count: int, tag: str | None = None):
        if not 1 <= count <= 200:
            raise ValueError(f"count must be in 1..200, got {count}")
        self.tag = tag or f"{random.getrandbits(16):04x}"
        self.subnet = f"10.213.{random.randint(1, 254)}"
        self.names = [f"sp-{self.tag}-{i}" for i in range(count)]
        self.bridge_ns = f"sp-{self.tag}-br"
        self.addrs = [f"{self.subnet}.{10 + i}" for i in range(count)]
        self.processes: list[subprocess.Popen] = []
        self._made: list[str] = []

    def host_veth(self, i: int) -> str:
        return f"vh{self.tag}{i}"

    def bridge_veth(self, i: int) -> str:
        return f"vb{self.tag}{i}"

    def __enter__(self) -> "Hosts":
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> None:
        for ns in (self.bridge_ns, *self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        br = self.bridge_ns
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            h, b = self.host_veth(i), self.bridge_veth(i)
            _ip("link", "add", h, "netns", ns, "type", "veth", "peer", "name", b, "netns", br)
            _ip("-n", br, "link", "set", b, "master", "br0")
            _ip("-n", br, "link", "set", b, "up")
            _ip("-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", h)
            _ip("-n", ns, "link", "set", h, "up")

    # -- faults and caps ----------------------------------------------------------------------
    def link_down(self, i: int) -> None:
        """Cut host i off (its only interface down): a partition, not a kill."""
        _ip("-n", self.names[i], "link", "set", self.host_veth(i), "down")

    def link_up(self, i: int) -> None:
        _ip("-n", self.names[i], "link", "set", self.host_veth(i), "up")

    def cap(self, i: int, rate: str = "40mbit", burst: str = "32kb", latency: str = "400ms") -> None:
        """A kernel bandwidth cap on host i's link, both directions (tbf shapes egress only,
        so it goes on both ends of the veth). The bucket should hold at least rate/HZ bytes, else tbf
        can under-deliver: hence 32 kB, not the issue's 32kbit (4 kB)."""
        for ns, dev in ((self.names[i], self.host_veth(i)), (self.bridge_ns, self.bridge_veth(i))):
            _ip("netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", rate, "burst", burst, "latency", latency)

    # -- processes ----------------------------------------------------------------------------
    def popen(self, i: int, argv: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        """Start argv inside host i's namespace, output to log_path; stopped by close()."""
        log = open(log_path, "ab")
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_parent, env={**os.environ, **(env or {})})
        finally:
            log.close()
        self.processes.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = 10.0) -> None:
        _killpg(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _killpg(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        for proc in self.processes:
            _killpg(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.processes:
            self.stop(proc, grace_s=0)
        for ns in self._made:  # anything still in our namespaces (a p2pd that escaped its group) is ours
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
