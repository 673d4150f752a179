"""One real swarm, shared by the tests that only watch a healthy run (a swarm's start and stop
cost more than most of these checks): a coordinator with its status page and four peer
processes with stages left to the coordinator, every forward spot-checked, /metrics on.

- the coordinator gives the auto peers every stage, they train and re-announce their stage;
- with spot checks on, an honest swarm reports only passes, for both replicas of its replicated stage;
  the run uses delayed updates (--gradient-exchange delayed), so the spot checks that compare the
  two replicas' forwards also show that those stay identical over real P2P when each step applies
  the average of the iteration before;
- a live export of its weights (`skippipe-coordinator export --initial-peers`), generated from;
- the status page in headless Chromium, and /metrics of the coordinator and a peer (CI installs Chromium);
- last, as it attacks the swarm: a rogue process sends a steady stream of malformed and malicious
  requests at every peer and forges adverts; training keeps progressing with no lost microbatch,
  no peer dies, memory stays flat, the coordinator never sees a forged advert. SKIPPIPE_SOAK_S
  (default 20) sets the attack's length: raise it for a longer soak.
"""
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from bench.support.harness import coordinator, peers, planned_with, wait_for
from tests.swarm.live import LiveSwarm
from bench.support.rogue import FORGED_SPEED, LYING_LAYERS
from coordinator.swarm_view import SwarmSnapshot, to_topology
from bench.support.soak import rss_mb, start_rogue, stop_rogue
from tests.swarm.status_dom import CHROMIUM, Dom, chromium, metrics_url
from tests.unit.opsweb.test_status_prom import samples

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
PEERS, STAGES = 4, 3              # equal peers: the planner gives stage 2 two replicas, the others one
PER_ITERATION = 1 * 2             # one stage-0 peer x 2 microbatches (harness.coordinator)
ATTACK_S = float(os.environ.get("SKIPPIPE_SOAK_S", "12"))   # a soak: SKIPPIPE_SOAK_S=300


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    live = LiveSwarm()
    live.tmp = tmp_path_factory.mktemp("shared-swarm")

    def start_peers(app):
        app.adjust_topology = planned_with(set())     # equal compute and links: a plan that does not hang on noise
        # --announce-period 2: adverts must not lapse on a box the rogue loads at the end
        return peers(app, live.tmp, PEERS, "--metrics-port", "0", "--spot-check-rate", "1", "--announce-period", "2")
    try:
        live.start(coordinator(min_peers=PEERS, num_stages=STAGES, skip_ratio=0.0, max_steps=0, status_port=0,
                               gradient_exchange="delayed"), start_peers)
        yield live
    finally:
        live.close()


def test_auto_peers_get_every_stage_and_train(swarm):
    async def check():
        app = swarm.app
        await wait_for(lambda: len(app.summaries) >= 3, 150, "three iterations")
        stages = app.schedule.stage_of()
        assert sorted(set(stages.values())) == [0, 1, 2] and len(stages) == PEERS
        # peers re-announce the stage they were given
        adverts = await wait_for(lambda: _adverts_with_stages(app, stages), 30, "adverts with the given stages")
        assert all(adverts[p].stage == s for p, s in stages.items())
        assert all(s.lost == 0 for s in app.summaries)
        # they advertise the speed they measure while training; on equal peers nobody is demoted
        await wait_for(lambda: _adverts_with_speeds(app, stages), 60, "adverts with measured speeds")
        assert app.slow_peers.factors == {}
    swarm.run(check(), 200)


async def _adverts_with_stages(app, stages):
    adverts = await app.records.get_adverts()
    return adverts if all(p in adverts and adverts[p].stage == s for p, s in stages.items()) else None


async def _adverts_with_speeds(app, stages):
    adverts = await app.records.get_adverts()
    return adverts if all(p in adverts and adverts[p].measured_fwd_s_per_layer_sample > 0 for p in stages) else None


def test_an_honest_swarm_with_checks_on_reports_only_passes(swarm):
    async def check():
        app = swarm.app
        await wait_for(lambda: len(app.summaries) >= 4, 240, "4 iterations")
        await wait_for(lambda: app.bans.counts["passed"] >= 4, 30, "spot-check reports")
        return app.bans, list(app.summaries), app.schedule, await app.records.get_spot_checks()
    bans, summaries, schedule, records = swarm.run(check(), 300)
    assert swarm.app.spec.gradient_exchange == "delayed"
    reports = [r for rec in records.values() for r in rec.reports]
    assert reports and all(r.passed for r in reports), [r for r in reports if not r.passed]
    assert bans.banned == {} and bans.counts["failed"] == 0
    stage_of = schedule.stage_of()
    replicated = {p for p, s in stage_of.items() if list(stage_of.values()).count(s) > 1}
    assert len(replicated) == 2 and {r.suspect for r in reports} == replicated   # both replicas were checked
    for s in summaries:
        assert s.completed + s.rerouted + s.skipped_stage + s.reissued == PER_ITERATION and s.lost == 0, s


def test_export_from_the_live_swarm_then_generate(swarm, tmp_path):
    """`skippipe-coordinator export --initial-peers`: the running swarm's weights over real
    hivemind P2P (every stage from one of its peers), a Hugging Face folder that transformers
    loads and generates from (here, in this process: the `generate` command's own run, a
    ~10 s interpreter start here, is tests/unit/peer/test_generate.py's)."""
    app = swarm.app
    swarm.run(wait_for(lambda: len(app.summaries) >= 3, 150, "three iterations"), 200)
    out = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "export", "--initial-peers", app.maddrs[0],
                           "--run", app.config.run, "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"exported live run {app.config.run}, iteration" in proc.stdout
    assert json.loads((out / "config.json").read_text())["skippipe_stage_layers"] == [2, 4, 6]
    import transformers      # here: only this test needs it, and it is slow to import
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    prompt = torch.tensor([tok("ROMEO:")["input_ids"]])
    with torch.no_grad():
        sampled = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    assert sampled.shape[1] > prompt.shape[1] and torch.equal(sampled[0, :prompt.shape[1]], prompt[0])
    assert int(sampled.max()) < len(tok)          # the export's padding rows are never sampled


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install -y chromium (.ci/run does)")
def test_status_page_renders_peers_stages_and_charts(swarm):
    async def scenario():
        app = swarm.app
        url = app.http.url
        await wait_for(lambda: len(app.summaries) >= 3, 200, "three iterations")
        dom_text = await asyncio.to_thread(chromium, "--dump-dom", url)
        shot = swarm.tmp / "status.png"
        await asyncio.to_thread(chromium, f"--screenshot={shot}", url)
        peer_metrics = metrics_url(swarm.tmp / "peer0.log")
        assert peer_metrics, "peer 0 did not log its metrics URL"
        peer_text = await asyncio.to_thread(lambda: urllib.request.urlopen(peer_metrics, timeout=10).read())
        coord_text = await asyncio.to_thread(lambda: urllib.request.urlopen(url + "metrics", timeout=10).read())
        return app.schedule.stage_of(), dom_text, shot, peer_text.decode(), coord_text.decode()

    stage_of, dom_text, shot, peer_text, coord_text = swarm.run(scenario(), 300)
    dom = Dom()
    dom.feed(dom_text)
    peer_rows = dom.rows.get("peers", [])
    assert len(peer_rows) == PEERS and all("ONLINE" in row for row in peer_rows), peer_rows
    # every peer's own self-test (loopback only here) and the coordinator's evidence are shown
    assert all(any(cell.endswith("self-test: local-only") for cell in row) for row in peer_rows), peer_rows
    stage_rows = dom.rows.get("stages", [])
    assert [row[0] for row in stage_rows] == [str(s) for s in range(STAGES)]
    assert sum(int(row[-1].split("/")[0]) for row in stage_rows) == len(stage_of) == PEERS
    assert dom.shapes.get("gantt:planned", 0) >= 3 * 2 and dom.shapes.get("gantt:measured", 0) >= 1, dom.shapes
    assert dom.shapes.get("loss-chart:series") == 1 and dom.shapes.get("loss-chart:point", 0) >= 3
    assert dom.shapes.get("time-chart:series") == 1
    assert dom.error.strip() == "" and 'data-rendered="' in dom_text   # the page's own error line is empty
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    peer = samples(peer_text)
    assert peer["skippipe_peer_up"] == 1 and peer["skippipe_peer_reachable"] == 1
    assert peer['skippipe_peer_microbatches_total{outcome="completed"}'] > 0 or peer["skippipe_peer_stage"] != 0
    assert peer["skippipe_peer_bytes_sent_total"] > 0 and peer['skippipe_peer_rpc_seconds_count{outcome="ok"}'] > 0
    assert peer["skippipe_peer_memory_rss_bytes"] > 10 * 2**20
    coord = samples(coord_text)
    assert coord["skippipe_coordinator_iterations_total"] >= 3
    assert coord['skippipe_coordinator_peers{state="online"}'] == PEERS


def test_training_survives_a_rogue_peer(swarm):
    """Last in this module: the attack is over when it ends, but the rogue's own adverts may linger."""
    async def scenario():
        app, procs = swarm.app, swarm.procs
        await wait_for(lambda: len(app.summaries) >= 2, 150, "two iterations before the attack")
        genuine = set(await app.records.get_adverts())
        rogue = start_rogue(app.maddrs, app.config.run, ATTACK_S, 40, swarm.tmp / "rogue.log")
        try:
            before = len(app.summaries)
            await asyncio.sleep(min(30.0, ATTACK_S / 4))      # the attack's own start-up, then a baseline
            rss_early = {p.pid: rss_mb(p.pid) for p in procs}
            give_up = time.monotonic() + ATTACK_S + 60
            while rogue.poll() is None and time.monotonic() < give_up:
                await asyncio.sleep(1.0)
                assert all(p.poll() is None for p in procs), "a peer died under attack"
                adverts = await app.records.get_adverts()
                assert not any(a.fwd_s_per_layer_sample == FORGED_SPEED
                               for p, a in adverts.items() if p in genuine), "forged advert seen"
            rss_late = {p.pid: rss_mb(p.pid) for p in procs}
            # the rogue's own advert claims 7 layers: ignored, and the rest is still plannable (issue 24)
            adverts = await app.records.get_adverts()
            liars = {p for p, a in adverts.items() if a.num_layers == LYING_LAYERS}
            assert liars and liars <= set(app.advert_gate.ignored), (liars, app.advert_gate.ignored)
            planned = to_topology(SwarmSnapshot(adverts, {}), app.spec, {})
            assert {n.id for n in planned.nodes} == genuine
        finally:
            await asyncio.to_thread(stop_rogue, rogue)
        report = (swarm.tmp / "rogue.log").read_text()
        sent = int(report.split("sent=")[1].split()[0]) if "sent=" in report else 0
        during = len(app.summaries) - before
        assert sent >= ATTACK_S * 10, report                  # the attack really ran
        assert during >= 3, f"only {during} iterations during the attack"
        assert all(s.lost == 0 for s in app.summaries), [s.lost for s in app.summaries]
        assert set(app.schedule.stage_of()) == genuine
        for pid, late in rss_late.items():
            assert late < 1500 and late - rss_early[pid] < 150, (rss_early, rss_late)
        await wait_for(lambda: len(app.summaries) >= before + during + 1, 60, "training after the attack")
    swarm.run(scenario(), ATTACK_S + 300)
