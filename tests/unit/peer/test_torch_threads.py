"""peer/runtime.py set_torch_threads: the event loop's thread computes with --threads too, even
when it had computed before (a peer forked from the launcher's fork server inherits a main
thread whose count the server fixed at the machine's cores)."""
import os
import subprocess
import sys

import pytest

PROBE = """
import threading, torch
from peer.runtime import set_torch_threads
torch.get_num_threads()          # this thread computed first: its count is fixed at the default
helper = threading.Thread(target=set_torch_threads, args=(1,))
helper.start(); helper.join()    # set off this thread only (as RuntimeFactory does, built off the loop)
off_loop = torch.get_num_threads()
set_torch_threads(1)
worker = []
later = threading.Thread(target=lambda: worker.append(torch.get_num_threads()))
later.start(); later.join()
print(off_loop, torch.get_num_threads(), worker[0])
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every count is 1 anyway")
def test_the_calling_thread_and_later_threads_get_the_count():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert out.returncode == 0, out.stderr
    off_loop, on_loop, later = out.stdout.split()
    assert int(off_loop) > 1            # set on another thread, it missed this one (the hazard)
    assert int(on_loop) == 1 and int(later) == 1
