"""Swarms across network namespaces (issue 9): every host has its own network stack and address,
so nothing can take a 127.0.0.1 shortcut; peers reach each other only by what they advertise."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.support.netns_swarm import iterations, start_coordinator, start_peer, wait_iterations, wait_maddrs
from tests.swarm.netns import links, make_hosts, make_module_hosts, status, wait_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
__all__ = ["make_hosts", "make_module_hosts"]   # the fixtures, imported so pytest sees them here
STATUS_PORT = 8321         # inside the coordinator's namespace: no clash with anything outside


def peer_id(log_path) -> str:
    for _ in range(240):
        m = re.search(r"joined run 't' .* as (\w+)", log_path.read_text() if log_path.exists() else "")
        if m:
            return m[1]
        time.sleep(0.25)
    raise AssertionError(f"no peer id in {log_path}")


def test_a_partitioned_middle_peer_is_routed_around_and_rejoins(make_hosts, tmp_path):
    hosts = make_hosts(5)                        # coordinator + stages 0, 1, 1, 2
    maddrs = wait_maddrs(start_coordinator(hosts, 0, tmp_path, "--stages", "3", "--min-peers", "4",
                                           "--steps", "100000", "--status-port", str(STATUS_PORT)))
    assert maddrs and all(f"/ip4/{hosts.addrs[0]}/" in m for m in maddrs), maddrs
    for i, stage in ((1, 0), (2, 1), (3, 1), (4, 2)):
        start_peer(hosts, i, tmp_path, maddrs, stage)
    cut = peer_id(tmp_path / "peer2.log")
    log, cut_log = tmp_path / "coordinator.log", tmp_path / "peer2.log"
    first = wait_iterations(log, 3, 150)
    # a swarm trains across namespaces: each has its own loopback, so the activations went over
    # the veths, to the addresses peers advertised
    assert [r["iteration"] for r in first[:3]] == [0, 1, 2]
    assert all(r["completed"] == 2 and r["lost"] == 0 for r in first[:3]), first
    before = len(first)
    hosts.link_down(2)                           # a partition: the process lives on, its link is gone
    wait_log(cut_log, "CUT OFF from the swarm", 60)          # the peer itself notices
    during = wait_iterations(log, len(iterations(log)) + 3, 120)[before:]
    events = status(hosts, 0, STATUS_PORT)["faults"]
    # the partition took one peer away, not the swarm: a healthy peer's advert may lapse for a
    # moment while DHT stores that touch the cut-off node stall (docs/fault-tolerance.md; seen
    # once in CI), but it must be back by the end
    departed = {e["peer"]: e["at"] for e in events if e["kind"] == "departed"}
    assert cut in departed and len(departed) <= 2, events
    hosts.link_up(2)
    wait_log(cut_log, "back in touch with the swarm", 60)
    wait_log(cut_log, "joined stage 1 with the state of replica", 120)   # rejoined like a late joiner
    healed = len(iterations(log))
    rows = wait_iterations(log, healed + 3, 120)
    s = status(hosts, 0, STATUS_PORT)
    ids = [p["peer_id"] for p in s["peers"]]
    assert len(ids) == len(set(ids)) == 4 and cut in ids, ids   # one identity for the healed peer
    for peer, at in departed.items():
        assert any(e["kind"] == "joined" and e["peer"] == peer and e["at"] > at for e in s["faults"]), s["faults"]
    for r in rows:   # every microbatch accounted for exactly once (1 stage-0 peer x --microbatches 2)
        assert r["completed"] + r["rerouted"] + r["skipped_stage"] + r["reissued"] + r["lost"] == 2, r
        assert r["lost"] == 0, r
    assert during and rows[-1]["loss"] < rows[0]["loss"]
    assert "abandoning iteration" in cut_log.read_text()      # it trained nothing on its own


def schedule_hops(hosts, i: int, maddrs: list[str]) -> dict:
    """{peer: hops on the published routes}, read from host i (bench/netns_probe.py)."""
    probe = Path(__file__).resolve().parents[2] / "bench" / "netns_probe.py"
    proc = subprocess.run(["ip", "netns", "exec", hosts.names[i], sys.executable, str(probe), "schedule", "t", *maddrs],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-1500:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def capped_swarm(make_module_hosts, tmp_path_factory):
    """Two stage-1 replicas, one behind a 40 mbit tbf cap (both directions of its link); shared
    by the routing test and the bandwidth measurement (a swarm across namespaces is slow to start)."""
    tmp_path = tmp_path_factory.mktemp("capped")
    hosts = make_module_hosts(5)                # coordinator + stages 0, 1 (free), 1 (capped), 2
    hosts.cap(3, rate="40mbit")
    maddrs = wait_maddrs(start_coordinator(hosts, 0, tmp_path, "--stages", "3", "--min-peers", "4",
                                           "--steps", "100000", "--microbatches", "4", "--skip", "0"))
    start_peer(hosts, 1, tmp_path, maddrs, 0)
    start_peer(hosts, 3, tmp_path, maddrs, 1)
    capped = peer_id(tmp_path / "peer3.log")
    deadline = time.monotonic() + 120                  # its links are measured before the plan
    while not any(capped in (r, p) for r, m in links(hosts, 0, "t", maddrs).items() for p in m):
        assert time.monotonic() < deadline, "no link records for the capped peer"
        time.sleep(3)
    start_peer(hosts, 2, tmp_path, maddrs, 1)
    start_peer(hosts, 4, tmp_path, maddrs, 2)
    free = peer_id(tmp_path / "peer2.log")
    wait_iterations(tmp_path / "coordinator.log", 2, 180)
    return hosts, maddrs, capped, free


def test_the_planner_routes_around_a_capped_link(capped_swarm):
    # with equal compute the planner would split the 4 microbatches between the two stage-1
    # replicas, 2 and 2; with the measured links it moves them off the capped one: all of them
    # on a quiet box, 3 of 4 when load makes the free links measure slow too (seen in CI: the
    # tiny model's activations cross 40 mbit in ~15 ms, so the cap then costs little)
    hosts, maddrs, capped, free = capped_swarm
    # a plan made while one replica's advert lapsed (DHT stores stall under load) has only the
    # other to route through, which says nothing about the cap: read a plan that has both
    deadline = time.monotonic() + 60
    while not {free, capped} <= set((schedule := schedule_hops(hosts, 0, maddrs))["stages"]):
        assert time.monotonic() < deadline, f"no plan with both stage-1 replicas: {schedule}"
        time.sleep(2)
    hops = schedule["hops"]
    assert hops.get(free, 0) >= 3 and hops.get(capped, 0) <= 1, hops


@pytest.mark.xfail(strict=False, reason="timing on a shared 2-core box: the best of two 1 MiB probes reads within 25% of the cap when the machine is quiet (passes then), 30-45% under heavy load")
def test_measured_bandwidth_matches_a_tbf_cap(capped_swarm):
    hosts, maddrs, capped_peer, _ = capped_swarm
    cap = 40e6 / 8
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = links(hosts, 0, "t", maddrs)
        capped = [bw for r, m in seen.items() for p, bw in m.items() if capped_peer in (r, p)]
        free = [bw for r, m in seen.items() for p, bw in m.items() if capped_peer not in (r, p)]
        if len(capped) >= 2 and free:
            break
        time.sleep(3)
    else:
        raise AssertionError(f"no link records for the capped peer: {seen}")
    for bw in capped:
        assert abs(bw - cap) / cap < 0.25, (bw, cap, seen)
    assert min(free) > 2 * cap, (free, cap)      # the uncapped link really is faster
