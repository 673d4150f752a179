"""`skippipe-swarm --topology`: real peers on emulated slow links (issue 6)."""
import json
import subprocess
import sys

import pytest

from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload, topology_to_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LATENCY_MS = 150.0


def write_topology(path, slowdown=3.0):
    w = Workload(num_layers=6, num_stages=2, microbatch_samples=4, microbatches_per_data_node=2,
                 activation_bytes_per_sample=64 * 64 * 4, memory_microbatches=8)
    nodes = (Node("eu-0", 0.001, stage=0), Node("us-1", 0.001, slowdown=slowdown), Node("asia-2", 0.001))
    lat = tuple(tuple(0.0 if i == j else LATENCY_MS for j in range(3)) for i in range(3))
    bw = tuple(tuple(0.01 for _ in range(3)) for _ in range(3))       # ~10 MB/s
    path.write_text(topology_to_json(Topology(TOPOLOGY_FORMAT, w, nodes, Links(lat, bw))))


def swarm(tmp_path, *args, timeout=500):
    cmd = [sys.executable, "-m", "launcher", "--logs-dir", str(tmp_path / "logs"),
           "--timeout", "400", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_emulated_latency_slows_every_iteration_and_is_logged(tmp_path):
    topo = tmp_path / "t.json"
    write_topology(topo)
    summary = tmp_path / "s.json"
    proc = swarm(tmp_path, "--topology", str(topo), "--stages", "2", "--steps", "4", "--skip", "0",
                 "--microbatches", "2", "--announce-period", "4", "--summary-json", str(summary))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["peers"] == 3 and s["microbatches"]["lost"] == 0
    # a microbatch crosses at least 4 emulated links (out to stage 1 and back, both ways) of 150 ms
    assert s["mean_iteration_s"] >= 4 * LATENCY_MS / 1000
    # the coordinator planned with the emulated links, so its prediction includes them too
    assert s["predicted_iteration_s"] >= 4 * LATENCY_MS / 1000
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("peer*.log"))
    assert logs.count("LINK EMULATION ON") == 3
    assert "node us-1 of 3" in logs and "compute slowdown x3" in logs
    node_map = json.loads((tmp_path / "logs" / "emulation" / "node-map.json").read_text())
    assert sorted(node_map.values()) == ["asia-2", "eu-0", "us-1"]


def test_bad_topology_and_peer_count_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    proc = swarm(tmp_path, "--topology", str(bad), timeout=60)
    assert proc.returncode == 2 and "--topology" in proc.stderr
    good = tmp_path / "t.json"
    write_topology(good)
    proc = swarm(tmp_path, "--topology", str(good), "--peers", "5", "--stages", "2", timeout=60)
    assert proc.returncode == 2 and "3 nodes" in proc.stderr
