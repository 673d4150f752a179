"""`skippipe-swarm` end to end: real processes, real P2P, the loss goes down (issue 4)."""
import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def run_swarm(tmp_path, *args, name="summary.json"):
    summary = tmp_path / name
    cmd = [sys.executable, "-m", "coordinator.swarm_cli", "--summary-json", str(summary),
           "--logs-dir", str(tmp_path / "logs"), "--timeout", "400", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(summary.read_text()), proc.stdout


def test_skippipe_swarm_trains_and_accounts_every_microbatch(tmp_path):
    summary, out = run_swarm(tmp_path, "--peers", "6", "--stages", "3", "--steps", "8", "--skip", "1/3",
                             "--microbatches", "3")
    assert summary["steps"] == 8
    assert summary["last_loss"] < summary["first_loss"] - 0.3
    mb = summary["microbatches"]
    assert mb["lost"] == 0
    # 6 peers, 3 stages, k=1/3 -> paths of 2 stages; the planner picks the data nodes
    assert mb["completed"] % 3 == 0 and mb["completed"] >= 8 * 3
    assert "stages skipped 33.3%" in out
    assert summary["tokens_per_s"] > 0 and summary["mean_iteration_s"] > 0


def test_checkpoint_and_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    first, _ = run_swarm(tmp_path, "--peers", "2", "--stages", "2", "--steps", "4", "--skip", "0",
                         "--checkpoint-dir", str(ckpt), name="first.json")
    assert sorted(p.name for p in ckpt.iterdir()) == ["local-stage0", "local-stage1"]
    for stage in ("local-stage0", "local-stage1"):   # --keep-last 2 (default): the last two iterations
        assert sorted(p.name for p in (ckpt / stage).iterdir()) == ["it00000002", "it00000003"]
    second, _ = run_swarm(tmp_path, "--peers", "2", "--stages", "2", "--steps", "7", "--skip", "0",
                          "--checkpoint-dir", str(ckpt), name="second.json")
    assert second["first_iteration"] == 4 and second["last_iteration"] == 6
    # resumed weights: the first resumed loss continues from where the first run ended
    assert second["first_loss"] < first["first_loss"] - 0.2
    assert abs(second["first_loss"] - first["last_loss"]) < 0.3
