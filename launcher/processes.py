"""Starting and stopping peer subprocesses on this machine (for skippipe-swarm and tests).

Each peer runs in its own session (process group) and dies with its parent (PDEATHSIG), so
a crash or kill of the launcher leaves no peer, DHT child or p2pd behind.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: process groups still let us clean up


def start_peer(args: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "peer.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
                                env={**os.environ, **(env or {})})
    finally:
        log.close()


def benchmark_once(model: str, samples: int, seq_len: int, timeout_s: float = 300) -> str:
    """Measure the layer benchmark afresh in one process (peer/benchmark_cli.py), before the
    peers start and read it from their cache; returns its line, or why it failed (then the
    peers measure, or use, what they have)."""
    cmd = [sys.executable, "-m", "peer.benchmark_cli", "--model", model, "--samples", str(samples),
           "--seq-len", str(seq_len)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"the layer benchmark took over {timeout_s:.0f}s; the peers use their cached one"
    out = (done.stdout or done.stderr).strip().splitlines()
    return out[-1] if out else f"the layer benchmark exited {done.returncode}"


def terminate_processes(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process group (what `docker stop` sends): each leaves the swarm in order."""
    for p in processes:
        _signal_group(p, signal.SIGTERM)


def wait_or_kill(processes: list[subprocess.Popen], grace_s: float) -> None:
    """Wait up to `grace_s` for processes already told to stop (a second SIGTERM would make
    them stop at once, unclean), then SIGKILL what is left."""
    deadline = time.monotonic() + grace_s
    for p in processes:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:
        _signal_group(p, signal.SIGKILL)  # the group: also the DHT child and its p2pd
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
