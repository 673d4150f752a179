"""coordinator.status_page: the status JSON, the page and /metrics, from a real (not started)
CoordinatorApp fed a real swarm snapshot, schedule and iteration reports."""
import asyncio
import json
import re
import time

import pytest

from coordinator.app import CoordinatorApp
from coordinator.config import CoordinatorConfig
from coordinator.planner import PlanConfig, plan
from coordinator.iteration_summaries import summarize
from coordinator.status_page import json_safe, reachability
from coordinator.swarm_view import SwarmSnapshot, to_topology
from opsweb.server import StatusServer
from protocol.adverts import LinkMeasurement, LinkReport, PeerAdvert, PeerState
from protocol.messages import IterationReport, MicrobatchCounts
from tests.unit.opsweb.test_status_prom import samples

PEERS = [f"Qm{c * 20}" for c in "ABCDEF"]


def advert(peer: str, i: int, state=PeerState.ONLINE) -> PeerAdvert:
    return PeerAdvert(peer_id=peer, state=state, device="cpu", memory_free_bytes=2**30,
                      fwd_s_per_layer_sample=1e-3 * (1 + i % 2), maddrs=(f"/ip4/127.0.0.1/tcp/{4000 + i}/p2p/{peer}",),
                      public_name=f"<b>peer{i}</b>", timestamp=time.time() - 1.0, num_layers=6, reachability="local-only",
                      activation_bytes_per_sample=32 * 64 * 4, param_bytes_per_layer=10_000, memory_microbatches=4)


def report(peer, iteration, start, took, **counts):
    return IterationReport(peer_id=peer, epoch=1, iteration=iteration, loss_sum=8.0, samples=2, tokens=64,
                           started_at=start, finished_at=start + took, counts=MicrobatchCounts(**counts),
                           stages_visited=6)


@pytest.fixture
def app():
    app = CoordinatorApp(CoordinatorConfig(run="view", num_stages=3, skip_ratio=1 / 3, microbatch_samples=2,
                                           seq_len=32, microbatches_per_origin=2))
    adverts = {p: advert(p, i) for i, p in enumerate(PEERS)}
    links = {PEERS[0]: LinkReport(PEERS[0], (LinkMeasurement(PEERS[1], 1.0, 1e9), LinkMeasurement(PEERS[2], 1.0, 1e9)))}
    app.snapshot = SwarmSnapshot(adverts, links)
    app.status.observe(app.snapshot)
    app.topology = to_topology(app.snapshot, app.spec, {})
    app._adopt(plan(app.topology, PlanConfig(skip_ratio=1 / 3, run="view", epoch=1), 0))
    t0 = time.time() - 10
    origins = sorted({r.origin for r in app.schedule.routes})
    reports = [report(p, 0, t0 + 0.1 * k, 2.0 + k, rerouted=1 if k == 0 else 0, completed=1)
               for k, p in enumerate(origins)]
    app.last_reports = {r.peer_id: r for r in reports}
    app.summaries.append(summarize(0, reports))
    app.summaries.append(summarize(1, [report(origins[0], 1, t0 + 5, 1.5, completed=2)]))
    app.replans.append({"epoch": 1, "published_at": t0, "start_iteration": 0, "peers": 6,
                        "membership_changed_at": t0})
    return app


def test_status_shows_peers_stages_gantt_and_history(app):
    s = app.status.status()
    assert [p["peer_id"] for p in s["peers"]] == PEERS
    p0 = s["peers"][0]
    assert p0["state"] == "ONLINE" and p0["name"] == "<b>peer0</b>" and 0.5 < p0["last_seen_s"] < 30
    assert p0["stage"] == app.schedule.stage_of()[PEERS[0]]
    assert p0["forward_samples_per_s"] == pytest.approx(1 / (1e-3 * 2))   # 6 layers / 3 stages
    stage_of = app.schedule.stage_of()
    assert [(st["stage"], st["replicas"]) for st in s["stages"]] == \
        [(k, sorted(p for p, v in stage_of.items() if v == k)) for k in range(3)]
    planned = s["gantt"]["planned"]
    assert planned["epoch"] == 1 and planned["total_s"] == pytest.approx(app.schedule.predicted_iteration_s, rel=0.05)
    assert {t["kind"] for t in planned["tasks"]} == {"F", "H", "B"}
    assert all(0 <= t["start"] <= t["end"] <= planned["total_s"] + 1e-9 for t in planned["tasks"])
    measured = s["gantt"]["measured"]
    assert measured["iteration"] == 0 and measured["spans"][0]["start"] == 0.0
    assert measured["total_s"] == pytest.approx(max(sp["end"] for sp in measured["spans"]))
    assert [i["iteration"] for i in s["iterations"]] == [0, 1] and s["iterations"][1]["duration_s"] == pytest.approx(1.5)
    kinds = [f["kind"] for f in s["faults"]]
    assert "replan" in kinds and "recovered" in kinds
    assert any("rerouted 1" in f["text"] for f in s["faults"])


def test_a_long_recovery_is_one_entry_and_keeps_membership_events(app):
    # 150 iterations in a row that needed recovery (a long partition), then one clean one
    origin, t0 = sorted({r.origin for r in app.schedule.routes})[0], time.time()
    app.status.events.append({"at": t0, "kind": "departed", "peer": PEERS[2], "text": "gone"})
    for i in range(2, 152):
        app.summaries.append(summarize(i, [report(origin, i, t0 + i, 0.5, rerouted=2)]))
    app.summaries.append(summarize(152, [report(origin, 152, t0 + 152, 0.5, completed=2)]))
    app.status.events.append({"at": t0 + 153, "kind": "joined", "peer": PEERS[2], "text": "back"})
    faults = app.status.status()["faults"]
    assert [f["kind"] for f in faults].count("departed") == 1
    assert [f["kind"] for f in faults][-1] == "joined"
    long_runs = [f for f in faults if f["text"].startswith("iterations 2-151")]
    assert len(long_runs) == 1 and long_runs[0]["text"].endswith("rerouted 300"), faults


def test_reachability_from_link_reports_and_addresses(app):
    snap = app.snapshot
    assert reachability(PEERS[1], snap) == {"verdict": "direct", "relayed": False, "public": False, "dialed_by": 1,
                                            "self_test": "local-only"}
    assert reachability(PEERS[0], snap)["verdict"] == "unverified"   # nobody measured a link to it
    relayed = SwarmSnapshot({"QmR": PeerAdvert(peer_id="QmR", state=PeerState.ONLINE, device="cpu", memory_free_bytes=0,
                                                 fwd_s_per_layer_sample=0.1,
                                                 maddrs=("/ip4/198.51.100.7/tcp/1/p2p/QmX/p2p-circuit/p2p/QmR",))}, {})
    assert reachability("QmR", relayed)["verdict"] == "relayed"


def test_departures_and_bans_become_events(app):
    adverts = dict(app.snapshot.adverts)
    adverts[PEERS[5]] = advert(PEERS[5], 5, PeerState.OFFLINE)
    app.bans.banned[PEERS[4]] = "failed 2 spot checks"
    del adverts[PEERS[4]]
    app.snapshot = SwarmSnapshot(adverts, app.snapshot.links)
    app.status.observe(app.snapshot)
    s = app.status.status()
    events = {(f["kind"], f["peer"]) for f in s["faults"]}
    assert {("departed", PEERS[4]), ("departed", PEERS[5]), ("banned", PEERS[4])} <= events
    banned = [p for p in s["peers"] if p["state"] == "BANNED"]
    assert [p["peer_id"] for p in banned] == [PEERS[4]] and banned[0]["banned"] == "failed 2 spot checks"


def test_metrics_reflect_the_run(app):
    got = samples(app.status.metrics())
    assert got['skippipe_coordinator_peers{state="online"}'] == 6
    assert got["skippipe_coordinator_epoch"] == 1 and got["skippipe_coordinator_iterations_total"] == 2
    assert got["skippipe_coordinator_iteration_seconds"] == pytest.approx(1.5)
    assert got["skippipe_coordinator_tokens_per_second"] == pytest.approx(64 / 1.5)
    assert got['skippipe_coordinator_microbatches_total{outcome="rerouted"}'] == 1
    assert got['skippipe_coordinator_microbatches_total{outcome="completed"}'] == len(app.last_reports) + 2


def test_nan_loss_is_valid_json():
    assert json.dumps(json_safe({"a": [float("nan"), 1.0, {"b": float("inf")}]}), allow_nan=False) == \
        '{"a": [null, 1.0, {"b": null}]}'


async def test_page_api_and_metrics_over_http(app):
    srv = StatusServer(app.status.routes())
    port = await srv.start()
    try:
        async def get(path):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = await r.read()
            w.close()
            head, _, body = data.partition(b"\r\n\r\n")
            return head.decode(), body
        head, body = await get("/")
        assert "200 OK" in head and b'<svg id="gantt"' in body
        # offline: nothing is loaded from elsewhere (no src/href/url()/import to another host)
        assert not re.search(rb"(src|href)\s*=|url\(|@import|fetch\(\s*[\"']https?:", body)
        head, body = await get("/api/status")
        assert "application/json" in head and json.loads(body)["run"] == "view"
        head, body = await get("/metrics")
        assert "version=0.0.4" in head and b"skippipe_coordinator_epoch 1" in body
    finally:
        await srv.close()


def test_maddrs_file_is_atomic_and_errors_are_logged(tmp_path, caplog):
    from coordinator.run_files import write_maddrs_file
    target = tmp_path / "coordinator.maddrs"
    write_maddrs_file(str(target), ["/ip4/172.28.0.10/tcp/31337/p2p/QmA", "/ip4/10.0.0.1/tcp/1/p2p/QmA"])
    assert target.read_text() == "/ip4/172.28.0.10/tcp/31337/p2p/QmA /ip4/10.0.0.1/tcp/1/p2p/QmA\n"
    assert not (tmp_path / "coordinator.tmp").exists()
    write_maddrs_file(str(tmp_path / "missing" / "x.maddrs"), ["/ip4/1.2.3.4/tcp/1"])
    assert "cannot write --maddrs-file" in caplog.text
