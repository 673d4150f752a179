"""Clean stops and the event loop of the long-running scripts (stdlib, and uvloop when
installed; peer/ and coordinator/ share it).

A terminal's Ctrl-C reaches the whole process group: our process, hivemind's DHT child
(which ignores SIGINT) and its p2pd (which dies at once). `docker stop` sends SIGTERM to our
process alone. Either way:
- the first signal sets the app's stop event, so it leaves the swarm in order, and starts a
  watchdog THREAD (the event loop may be blocked in a join or a DHT call whose daemon is gone);
- if the app is not out within `grace_s`, or on a second signal, every process we started
  (found through /proc, by parent pid, not by name) is SIGKILLed and we exit at once.
After the app returns, GracefulStop.finish ends what outlived the DHT's own shutdown (an
orphaned p2pd).
"""
import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import threading

logger = logging.getLogger("skippipe.stop")
GRACE_S = 4.0          # the target is "gone within 5 s"; a second signal: at once
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return tree
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":       # a zombie is already dead
            tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def descendants(pid: int | None = None) -> list[int]:
    """Live descendant pids of `pid` (default: us), through /proc; elsewhere our
    multiprocessing children only."""
    pid = os.getpid() if pid is None else pid
    tree = _children_of()
    if not tree and pid == os.getpid():
        return [p.pid for p in multiprocessing.active_children() if p.pid]
    out, todo = [], [pid]
    while todo:
        kids = tree.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_all(pids, sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def shutdown_dht(dht) -> None:
    """hivemind's DHT.shutdown(), except when the DHT child's p2pd is already gone (a Ctrl-C
    reaches the whole process group, and p2pd dies of it): its graceful shutdown then only
    waits out its timeout, so the child is terminated at once."""
    if dht.is_alive() and os.path.isdir("/proc") and not descendants(dht.pid):
        dht.terminate()
        dht.join(1.0)
        return
    dht.shutdown()


def _quiet_thread_connection_errors() -> None:
    """While stopping, a background thread of multiprocessing (its resource sharer) may lose
    its connection to the DHT child we just ended: expected, not worth a traceback."""
    previous = threading.excepthook

    def hook(args):
        if not issubclass(args.exc_type, (ConnectionError, EOFError)):
            previous(args)
    threading.excepthook = hook


_fork_hook_installed = False


def _default_signals() -> None:
    try:
        signal.set_wakeup_fd(-1)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
    except (ValueError, OSError):
        pass


def _reset_signals_in_forked_children() -> None:
    """hivemind forks its DHT child from our running loop: without this the child inherits
    our handlers, ignores SIGTERM and writes the signal into OUR loop's wake-up socket."""
    global _fork_hook_installed
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_default_signals)
        _fork_hook_installed = True


class GracefulStop:
    """Installs SIGINT/SIGTERM handlers on a running loop that set `stop` (see module doc)."""

    def __init__(self, stop: asyncio.Event, what: str = "", grace_s: float = GRACE_S):
        self.stop, self.what, self.grace_s = stop, what, grace_s
        self.signals = 0
        self.known: set[int] = set()   # processes seen when the stop began (p2pd may be orphaned later)
        self._timer: threading.Timer | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> "GracefulStop":
        _reset_signals_in_forked_children()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.on_signal, sig)
        return self

    def on_signal(self, sig: int) -> None:
        self.signals += 1
        if self.signals > 1:
            self.force(sig, "second signal")
        self.known.update(descendants())
        logger.info("stopping%s (%s; again to stop at once)", f" {self.what}" if self.what else "",
                    signal.Signals(sig).name)
        self.stop.set()
        _quiet_thread_connection_errors()
        self._timer = threading.Timer(self.grace_s, self.force, (sig, f"not stopped within {self.grace_s:.0f}s"))
        self._timer.daemon = True
        self._timer.start()

    def force(self, sig: int, why: str) -> None:
        sys.stderr.write(f"{why}: killing child processes and exiting\n")
        sys.stderr.flush()
        kill_all(self.known | set(descendants()))
        os._exit(128 + sig)

    def finish(self) -> None:
        """After the app returned: no survivors; a late signal exits at once. After a stop
        signal the watchdog keeps running: the interpreter's own exit (joining threads and
        hivemind's children) must fit the same grace."""
        if self._timer is not None and not self.signals:
            self._timer.cancel()
        kill_all(self.known | set(descendants()), signal.SIGTERM)
        for sig in STOP_SIGNALS:   # the loop is closed: its handlers are gone
            signal.signal(sig, lambda s, _frame: self.force(s, "signal during exit"))


def run_until_stopped(main, what: str = ""):
    """Run `main(stop_event)` (a coroutine function) on a fresh loop with a GracefulStop
    setting `stop_event`; returns main's result."""
    holder: list[GracefulStop] = []

    async def runner():
        stopper = GracefulStop(asyncio.Event(), what).install(asyncio.get_running_loop())
        holder.append(stopper)
        result = await main(stopper.stop)
        if stopper.signals:   # left in order: a worker thread (a benchmark) is not worth waiting for
            stopper.finish()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(result if isinstance(result, int) else 0)
        return result
    try:
        return run_loop(runner())
    finally:
        if holder:
            holder[0].finish()


def run_loop(coro, kind: str | None = None):
    """asyncio.run on uvloop (the design's event loop; measured no slower by bench/swarm.py
    --loop), or on asyncio's own loop with kind="asyncio" or SKIPPIPE_EVENT_LOOP=asyncio, or
    when uvloop is not installed (macOS/Linux have wheels; it is a dependency)."""
    kind = kind or os.environ.get("SKIPPIPE_EVENT_LOOP", "uvloop")
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if kind == "asyncio" or uvloop is None:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
