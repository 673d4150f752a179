"""Peers forked from the fork server (launcher/fork_server.py) behave as `python -m peer.cli`
did: their own session, their output in their log, SIGTERM honoured (the server ignores it),
exit codes as Popen gives them; SKIPPIPE_LOCAL_PEERS=exec still starts a fresh interpreter."""
import os
import signal
import subprocess
import time
from pathlib import Path

import hivemind
import pytest

from launcher.fork_server import ForkedPeer, ensure_server
from bench.support.harness import stop_processes
from launcher.processes import start_peer

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def ignored_signals(pid: int) -> int:
    line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_for_text(path: Path, text: str, proc, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text(errors="replace")[-2000:]
        time.sleep(0.2)


def test_a_forked_peer_runs_in_its_own_session_logs_and_stops_on_sigterm(tmp_path, monkeypatch):
    monkeypatch.delenv("SKIPPIPE_LOCAL_PEERS", raising=False)
    dht = hivemind.DHT(start=True, host_maddrs=[LOOPBACK])
    log, peer = tmp_path / "peer.log", None
    try:
        peer = start_peer(["--initial-peers", *map(str, dht.get_visible_maddrs()), "--run", "no-such-run",
                           "--no-benchmark", "--host-maddrs", LOOPBACK], log)
        assert isinstance(peer, ForkedPeer)
        wait_for_text(log, "no run spec for run 'no-such-run'", peer)     # the real peer, logging to its file
        assert os.getsid(peer.pid) == peer.pid                          # its group: killpg reaches all of it
        with pytest.raises(subprocess.TimeoutExpired):
            peer.wait(timeout=0.1)
        server = parent_of(peer.pid)
        assert ignored_signals(server) & (1 << (signal.SIGTERM - 1))     # the server outlives a group SIGTERM
        assert not ignored_signals(peer.pid) & (1 << (signal.SIGTERM - 1))
        os.kill(peer.pid, signal.SIGTERM)
        assert peer.wait(timeout=10) == 0 and peer.returncode == 0       # it left cleanly
        assert "stopping the peer (SIGTERM" in log.read_text()
    finally:
        if peer is not None:
            stop_processes([peer])
        dht.shutdown()


def test_exit_codes_as_popen_gives_them_forked_or_exec(tmp_path, monkeypatch):
    monkeypatch.delenv("SKIPPIPE_LOCAL_PEERS", raising=False)
    ensure_server()
    # set after the server started: a forked peer gets the environment of its start, as with Popen
    monkeypatch.setenv("SKIPPIPE_INITIAL_PEERS", "/ip4/127.0.0.1/tcp/1")
    bad = start_peer(["--no-such-flag"], tmp_path / "bad.log")
    assert isinstance(bad, ForkedPeer) and bad.wait(timeout=30) == 2
    assert "unrecognized arguments: --no-such-flag" in (tmp_path / "bad.log").read_text()
    monkeypatch.setenv("SKIPPIPE_LOCAL_PEERS", "exec")
    fresh = start_peer(["--version"], tmp_path / "version.log")
    assert isinstance(fresh, subprocess.Popen) and fresh.wait(timeout=30) == 0
    assert "skippipe" in (tmp_path / "version.log").read_text().lower()
