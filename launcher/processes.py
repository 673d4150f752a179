"""Starting and stopping peer subprocesses on this machine (for skippipe-swarm and tests).

Each peer runs in its own session (process group) and dies with its parent (PDEATHSIG), so
a crash or kill of the launcher leaves no peer, DHT child or p2pd behind. Peers are forked from
a fork server that imported torch and hivemind once (launcher/fork_server.py), or, with
SKIPPIPE_LOCAL_PEERS=exec, started as `python -m peer.cli`.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.fork_server import ForkedPeer, die_with_parent, ensure_server, forking_enabled, start_forked_peer

PeerProcess = subprocess.Popen | ForkedPeer


def start_peer(args: list[str], log_path: Path) -> PeerProcess:
    """`skippipe-peer ARGS` with its output appended to `log_path`."""
    if forking_enabled():
        return start_forked_peer(args, log_path)
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "peer.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
    finally:
        log.close()


def prepare_peer_starts() -> None:
    """Start what start_peer forks from, if it forks (blocking: call it in a thread early on)."""
    if forking_enabled():
        ensure_server()


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


def terminate_processes(processes: list[PeerProcess]) -> None:
    """SIGTERM each process group (what `docker stop` sends): each leaves the swarm in order."""
    for p in processes:
        _signal_group(p, signal.SIGTERM)


def wait_or_kill(processes: list[PeerProcess], grace_s: float) -> None:
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


def _signal_group(p: PeerProcess, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
