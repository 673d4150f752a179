"""launcher/pauses.py: `--chaos pause:P@iterN:S` stops peer P's process group, then resumes it."""
import asyncio
import subprocess
import sys
import time
from pathlib import Path

from launcher.pauses import Pause, Pauser


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]   # R, S, T (stopped), ...


def test_a_pause_stops_the_peer_at_its_iteration_and_resumes_it_after_its_seconds():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
             for _ in range(2)]
    try:
        async def scenario():
            pauser = Pauser([Pause(1, 3, 0.5)], procs)
            pauser.on_iteration(1)                      # iteration 2 starts: not yet
            assert state(procs[1].pid) != "T"
            pauser.on_iteration(2)                      # iteration 3 starts: peer 1 stops
            assert state(procs[1].pid) == "T" and state(procs[0].pid) != "T"
            deadline = time.monotonic() + 5
            while state(procs[1].pid) == "T" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert state(procs[1].pid) != "T"           # resumed after 0.5 s
            again = Pauser([Pause(0, 0, 60)], procs)
            again.on_iteration(0)
            assert state(procs[0].pid) == "T"
            again.resume_all()                          # the launcher stops the swarm: resume first
            assert state(procs[0].pid) != "T" and not again.stopped
        asyncio.run(scenario())
    finally:
        for p in procs:
            p.kill()
            p.wait()
