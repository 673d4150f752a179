"""launcher/pauses.py: `--chaos pause:P@iterN:S` stops peer P's process group, then resumes it."""
import asyncio
import subprocess
import sys
import time
from pathlib import Path

from launcher.pauses import Pause, Pauser


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]   # R, S, T (stopped), ...


def stopped(pid: int, timeout: float = 5.0) -> bool:
    """Whether `pid` is stopped (T), once a signal sent to it has had time to land."""
    deadline = time.monotonic() + timeout
    while state(pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    return state(pid) == "T"


def running(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while state(pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    return state(pid) != "T"


def test_a_pause_stops_the_peer_at_its_iteration_and_resumes_it_after_its_seconds():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
             for _ in range(2)]
    try:
        async def scenario():
            pauser = Pauser([Pause(1, 3, 0.5)], procs)
            pauser.on_iteration(1)                      # iteration 2 starts: not yet
            assert not stopped(procs[1].pid, timeout=0.3)
            pauser.on_iteration(2)                      # iteration 3 starts: peer 1 stops
            assert stopped(procs[1].pid) and state(procs[0].pid) != "T"
            await asyncio.sleep(0.7)                    # the loop runs the resume after 0.5 s
            assert running(procs[1].pid)
            again = Pauser([Pause(0, 0, 60)], procs)
            again.on_iteration(0)
            assert stopped(procs[0].pid)
            again.resume_all()                          # the launcher stops the swarm: resume first
            assert running(procs[0].pid) and not again.stopped
        asyncio.run(scenario())
    finally:
        for p in procs:
            p.kill()
            p.wait()
