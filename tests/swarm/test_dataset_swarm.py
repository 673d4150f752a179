"""A run that names its dataset (issue 21), over real processes and P2P: volunteers with no data
of their own download it from the coordinator (hash-checked) and train on it, and when a data
node dies mid-iteration no sample is trained twice or skipped: the lost ones come back later."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tokendata.manifest import read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def make_dataset(tmp_path):
    text = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["swarm", "pipeline", "stage", "skip", "volunteer", "token", "shard", "peer"]
    text.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(3000)))
    out = tmp_path / "dataset"
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "data", "--input", str(text), "--tokenizer",
                           "bpe", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_volunteers_download_the_dataset_and_a_dead_data_node_loses_no_sample(tmp_path):
    dataset = make_dataset(tmp_path)
    manifest = read_manifest(dataset)
    cache = tmp_path / "peer-cache"
    summary_path = tmp_path / "summary.json"
    # peers 0 and 2 are stage 0 (--chaos pins peer i to stage i % 2); peer 2 dies mid-forward
    cmd = [sys.executable, "-m", "launcher", "--peers", "4", "--stages", "2", "--steps", "60",
           "--skip", "0", "--microbatches", "2", "--data", str(dataset), "--chaos", "kill:2@iter3:forward",
           "--summary-json", str(summary_path), "--logs-dir", str(tmp_path / "logs"), "--timeout", "400",
           "--status-port", "off",
           "--switch-margin", "2"]      # epochs that carry lost samples take effect within the run
    env = {**os.environ, "SKIPPIPE_CACHE_DIR": str(cache)}    # every peer's --cache-dir: nothing there yet
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())

    # the volunteers' copy is the coordinator's, byte for byte
    copy = cache / "datasets" / manifest.dataset_id
    assert read_manifest(copy).dataset_id == manifest.dataset_id
    for shard in manifest.shards:
        assert (copy / shard.file).read_bytes() == (dataset / shard.file).read_bytes()
    assert summary["data"]["dataset_id"] == manifest.dataset_id
    assert summary["last_loss"] < summary["first_loss"]

    rows = summary["iterations"]
    trained = [p for r in rows for start, count in zip(r["positions"][::2], r["positions"][1::2])
               for p in range(start, start + count)]
    assert len(trained) == len(set(trained)), "a sample was trained twice"
    assert sum(len(r["lost_microbatches"]) for r in rows) > 0, "the dead data node lost nothing: no test"
    owed = summary["data"]["owed_samples"]
    assert not set(owed) & set(trained)
    # nothing skipped: every position below the highest one trained was trained or is still owed
    seen = set(trained) | set(owed)
    assert sorted(seen) == list(range(max(seen) + 1))
    assert summary["data"]["lost_samples"] > len(owed), "no lost sample was trained again"
