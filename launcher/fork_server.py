"""Peers forked from a server that imported torch and hivemind once.

A peer started as `python -m peer.cli` spends ~2 CPU seconds importing torch, hivemind and their
dependencies, and ~2.4 more importing torch._dynamo when it builds its optimiser (torch.optim
imports it on first use); a local swarm starts several at once on a machine with few cores. So
the launcher forks them from multiprocessing's fork server, which imports all that once (its
preload) and forks a ready interpreter per peer. Each forked peer then does what
`python -m peer.cli` would: its own session, death with its parent, stdout and stderr into
its log, stdin from /dev/null.

SKIPPIPE_LOCAL_PEERS=exec starts every peer as a fresh interpreter instead (the way a user runs
`skippipe-peer`); so does every platform but Linux.
"""
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
# In the server's command line too: `pgrep -f peer.cli` finds forked peers as it finds exec'd ones.
PRELOAD = ["launcher.fork_server_setup", "peer.cli", "peer.app", "torch._dynamo"]
MODES = ("fork", "exec")


def start_mode() -> str:
    """SKIPPIPE_LOCAL_PEERS: fork (the default) or exec; ValueError on anything else."""
    mode = os.environ.get("SKIPPIPE_LOCAL_PEERS", "fork").strip().lower() or "fork"
    if mode not in MODES:
        raise ValueError(f"SKIPPIPE_LOCAL_PEERS must be fork or exec, got {mode!r}")
    return mode


def forking_enabled() -> bool:
    # Linux only: macOS frameworks are not fork-safe once loaded, and Windows has no fork
    return start_mode() == "fork" and sys.platform.startswith("linux")


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def ensure_server() -> None:
    """Start the fork server now (~5 CPU s of imports), e.g. in a thread while the coordinator
    comes up, rather than inside the first start_forked_peer."""
    _context()
    from multiprocessing import forkserver
    forkserver.ensure_running()


class ForkedPeer:
    """A forked peer, with the parts of subprocess.Popen that the launcher and tests use."""

    def __init__(self, process: multiprocessing.Process):
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode        # -N when signal N ended it, like Popen

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("peer.cli", timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_forked_peer(args: list[str], log_path: Path) -> ForkedPeer:
    process = _context().Process(target=_peer_main, args=(list(args), str(log_path), dict(os.environ)),
                                 name="peer.cli", daemon=False)   # daemons may not start children (the DHT's)
    process.start()
    return ForkedPeer(process)


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: process groups still let us clean up


def _peer_main(args: list[str], log_path: str, environ: dict[str, str]) -> None:
    # the server ignores SIGTERM (fork_server_setup); a peer, its DHT child and p2pd must not
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server = os.getppid()
    os.setsid()
    os.environ.clear()              # the launcher's environment now, as Popen would pass it (not the
    os.environ.update(environ)      # server's, which it had when it started); the cwd comes with the start
    die_with_parent()               # the parent is the server, which ends with the launcher
    if os.getppid() != server:      # it ended before that took effect
        os._exit(1)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    sys.argv = ["skippipe-peer", *args]
    from peer.cli import main
    code = main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
