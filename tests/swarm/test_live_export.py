"""`skippipe-coordinator export --initial-peers`: a running swarm's weights over real hivemind P2P."""
import json
import re
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_export_from_a_live_swarm(tmp_path):
    swarm = subprocess.Popen([sys.executable, "-m", "launcher", "--peers", "3", "--stages", "3",
                              "--steps", "1000", "--skip", "0", "--timeout", "500"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        maddr = None
        for line in swarm.stdout:
            maddr = maddr or (re.search(r"coordinator up at (\S+);", line) or [None, None])[1]
            if re.search(r"iter [3-9]/1000", line):
                break
        assert maddr, "the swarm did not start"
        out = tmp_path / "hf"
        proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "export", "--initial-peers", maddr,
                               "--run", "local", "-o", str(out)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "exported live run local, iteration" in proc.stdout
        assert json.loads((out / "config.json").read_text())["skippipe_stage_layers"] == [2, 4, 6]
        stop(swarm)            # the export is on disk: generating needs no swarm (nor its CPU)
        gen = subprocess.run([sys.executable, "-m", "coordinator.cli", "generate", "--checkpoint", str(out),
                              "--prompt", "ROMEO:", "--max-new-tokens", "8"], capture_output=True, text=True,
                             timeout=120)
        assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr
    finally:
        stop(swarm)


def stop(swarm: subprocess.Popen) -> None:
    if swarm.poll() is not None:
        return
    swarm.send_signal(signal.SIGINT)       # the launcher stops its peers and the coordinator
    try:
        swarm.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        swarm.kill()
        swarm.communicate()
