"""Churn over real processes and real P2P (issue 5): kill -9 mid-forward, mid-backward and
between iterations, a stalled peer, a late joiner, and a coordinator restart (the last two on one
swarm). Each asserts that training continues, every microbatch is accounted for exactly once, and
the loss goes down."""
import asyncio
import contextlib
import json
import re
import subprocess
import sys

import pytest

from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload, topology_to_json
from bench.support.harness import coordinator, peers, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
PER_ITERATION = 2 * 2          # 2 stage-0 peers x --microbatches 2


def write_uniform_topology(path, nodes: int = 6, stages: int = 3, microbatches: int = 4):
    """Equal nodes and 1 ms links: the planner then spreads work over a stage's replicas, instead
    of sending it all to whichever replica's measured link looked a little faster on a loaded box
    (which can leave the victim idle, so its death needs no recovery)."""
    w = Workload(num_layers=6, num_stages=stages, microbatch_samples=4, microbatches_per_data_node=microbatches,
                 activation_bytes_per_sample=64 * 64 * 4, memory_microbatches=8)
    lat = tuple(tuple(0.0 if i == j else 1.0 for j in range(nodes)) for i in range(nodes))
    bw = tuple(tuple(1.0 for _ in range(nodes)) for _ in range(nodes))
    topology = Topology(TOPOLOGY_FORMAT, w, tuple(Node(f"n{i}", 0.001) for i in range(nodes)), Links(lat, bw))
    path.write_text(topology_to_json(topology))
    return path


def run_chaos(tmp_path, chaos: str, steps: int = 6, skip: str = "0", microbatches: int = 2, *extra: str):
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "launcher", "--peers", "6", "--stages", "3", "--steps", str(steps),
           "--skip", skip, "--microbatches", str(microbatches), "--chaos", chaos, "--summary-json", str(summary),
           "--logs-dir", str(tmp_path / "logs"), "--timeout", "400", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(summary.read_text()), proc.stdout


def assert_accounted(rows, per_iteration: int = PER_ITERATION):
    for r in rows:
        ended = r["completed"] + r["rerouted"] + r["skipped_stage"] + r["reissued"] + r["lost"]
        assert ended == per_iteration, r
        assert r["lost"] == 0, r


# forward over real P2P in the default suite; backward and between too with `-m extended` (the
# in-process tests in tests/integration/test_churn_recovery.py kill mid-forward and mid-backward): each swarm
# costs ~30 s of the suite's 10 minutes on 2 cores
@pytest.mark.parametrize("when", ["forward", pytest.param("backward", marks=pytest.mark.extended),
                                  pytest.param("between", marks=pytest.mark.extended)])
def test_kill_a_middle_stage_peer(tmp_path, when):
    # k = 0: every microbatch visits stage 1, and on equal nodes the planner gives both of its
    # replicas a share of the 8 microbatches, so the victim (peer 1: stage 1) has work to die in
    topology = write_uniform_topology(tmp_path / "uniform.json")
    summary, out = run_chaos(tmp_path, f"kill:1@iter2:{when}", 6, "0", 4, "--topology", str(topology))
    rows = summary["iterations"]
    assert [r["iteration"] for r in rows] == list(range(6))
    assert_accounted(rows, per_iteration=2 * 4)
    recovered = [r["iteration"] for r in rows if r["rerouted"] + r["skipped_stage"] + r["reissued"]]
    assert recovered and recovered[0] >= 2, rows     # the kill (at iteration 2 or its next task) bit
    assert "recovered:" in out
    assert summary["losses"][-1] < summary["losses"][recovered[0]] < summary["losses"][0]


def test_a_stalled_peer_slows_and_a_stopped_one_pauses_but_neither_breaks_training(tmp_path):
    # equal nodes and links, so the victim (peer 2: stage 2) has work to stall in; microbatches
    # of 16 x 128 tokens, so that its compute (x10) outweighs the ~0.2 s an iteration of tiny
    # 4 x 64 microbatches spends in RPC overheads (with those a stall once added only 20%).
    # Then (once the origins' round trips had a few stalled iterations to show it: the ones
    # around the stop witness nothing) peer 1 (stage 1) is stopped with SIGSTOP for 8 s: the IterationDone messages it
    # misses meanwhile once made it, and the replica waiting for its share, wait out the 120 s
    # iteration timeout and lose microbatches after it resumed (issue 25). Last, peer 4 (stage 1)
    # hangs for 6 s from iteration 12: it answers pings but drops the forwards it takes, which
    # only hop deadlines catch (without them its microbatches waited out the 120 s timeout). It
    # comes after the stall's witnessed iterations: rerouted ones witness nothing.
    topology = write_uniform_topology(tmp_path / "uniform.json")
    summary, out = run_chaos(tmp_path, "stall:2@iter3:10,lie:2@iter3:10,pause:1@iter9:8,hang:4@iter12:6", 15, "1/3", 4,
                             "--topology", str(topology),
                             "--microbatch-samples", "16", "--seq-len", "128")
    rows = summary["iterations"]
    assert_accounted(rows, per_iteration=2 * 4)
    assert summary["microbatches"]["lost"] == 0
    before = sorted(r["duration_s"] for r in rows[1:3])[0]
    assert max(r["duration_s"] for r in rows[3:]) > 1.5 * before   # it really stalled
    assert "peer 1 stopped (SIGSTOP)" in out and "peer 1 resumed" in out
    assert max(r["duration_s"] for r in rows[9:]) < 40, rows       # nobody waited out the timeout
    # the re-plan without the stopped peer and the one with it back each came within seconds
    # (when its advert lapsed: one stretched by slow DHT stores outlives an 8 s stop, and then
    # the iterations route around it, above, with no re-plan). Quiet box: 7.5 s after the stop,
    # 4.5 s after the resume; a CI run: 6.0 s and 21.9 s
    stop_at = rows[8]["started_at"] + rows[8]["duration_s"]   # stopped once iteration 8 was summarised
    plans = [(p["published_at"], p["peers"]) for p in summary["replans"] if p["published_at"] > stop_at]
    dropped = next((t for t, n in plans if n == 5), None)
    if dropped is not None:
        back = next((t for t, n in plans if n == 6 and t > dropped), None)
        assert dropped - stop_at < 20 and back is not None and back - (stop_at + 8) < 30, (stop_at, plans)
    assert sum(r["rerouted"] + r["skipped_stage"] + r["reissued"] for r in rows[12:]) > 0, rows
    assert summary["last_loss"] < summary["first_loss"]
    # the stalled peer's advert hides its slowdown (lie: it claims the speed it had), as do its
    # benchmark and the topology file; the origins' round trips show it, and the coordinator
    # demoted it by them: in a re-plan, or, when the demotion came too close to the run's end
    # for one, in its final state
    stalled, hung = (re.search(r"peer (\w{12}) state=", (tmp_path / "logs" / f"peer{p}.log").read_text()).group(1)
                      for p in (2, 4))
    # the peers that handed the hung one its forwards routed around it at their hop deadline
    # and named it late: the coordinator demoted it at once (x10), in a re-plan or finally
    assert any(f"{hung} missed its hop deadline" in (tmp_path / "logs" / f"peer{p}.log").read_text()
               for p in (0, 1, 2, 3, 5)), out
    # (witnessed ratios carry the overheads every route shares: 2.4-4.8 for this 10x stall; once
    # demoted it gets less work and is planned at the lower ratio it then shows: the highest counts)
    demoted: dict[str, float] = {}
    for p, ratio in [*((p, r) for plan in summary["replans"] for p, r in plan.get("slow_peers", {}).items()),
                     *summary["slow_peers"].items()]:
        demoted[p[:12]] = max(demoted.get(p[:12], 0.0), ratio)
    assert sorted(demoted) == sorted([stalled, hung]) and demoted[stalled] >= 2 and demoted[hung] >= 10, (
        summary["replans"], summary["slow_peers"], summary["witnessed"])


def test_a_late_joiner_gets_the_stage_state_then_a_restarted_coordinator_continues(tmp_path):
    """Two checks on one swarm, one after the other (its start-up costs more than either): a peer
    joining mid-run gets its stage's state; then the coordinator restarts and continues from the
    stored epoch, with the peers (the joiner among them) going on meanwhile."""
    async def scenario():
        with contextlib.ExitStack() as procs:
            # max_steps leaves room: the re-plan starts a few seconds of iterations after the joiner
            # appears, and a slow start-up on a loaded machine must not run past the end of the run
            key = str(tmp_path / "organiser.pem")     # the restarted coordinator signs with the same key
            async with coordinator(num_stages=2, skip_ratio=0.0, min_peers=3, max_steps=100000,
                                   organiser_key_path=key) as first:
                procs.enter_context(peers(first, tmp_path, 3, stages=[0, 1, 1]))
                await wait_for(lambda: len(first.summaries) >= 3, 180, "3 iterations")
                epoch = first.schedule.epoch
                procs.enter_context(peers(first, tmp_path / "late", 1, stages=[1]))
                await wait_for(lambda: first.schedule.epoch > epoch and len(first.schedule.stage_of()) == 4,
                               60, "a re-plan that includes the joiner")
                start = first.schedule.start_iteration
                await wait_for(lambda: first.summaries and first.summaries[-1].iteration >= start + 3, 180,
                               "iterations with the joiner")
                log = (tmp_path / "late" / "peer0.log").read_text()
                assert "joined stage 1 with the state of replica" in log, log[-3000:]
                joined = list(first.summaries)
                adverts = await first.records.get_adverts()
                maddrs = [a for adv in adverts.values() for a in adv.maddrs if "127.0.0.1" in a]
                old_epoch, last_seen = first.schedule.epoch, first.summaries[-1].iteration
            # the coordinator is gone; the peers go on with the schedule they have
            async with coordinator(num_stages=2, skip_ratio=0.0, min_peers=3, max_steps=100000,
                                   initial_peers=tuple(maddrs[:1]), organiser_key_path=key) as second:
                await wait_for(lambda: second.schedule is not None, 30, "the stored schedule")
                epochs = [s.epoch for s in second.published.all]   # the stored one, and the one before it
                assert old_epoch in epochs and epochs == sorted(epochs), epochs   # picked up, not started over
                await wait_for(lambda: second.summaries and second.summaries[-1].iteration > last_seen + 2,
                               180, "iterations after the restart")
                assert second.schedule.epoch >= old_epoch
                return joined, last_seen, list(second.summaries)
    (tmp_path / "late").mkdir()
    joined, last_seen, after = asyncio.run(scenario())
    assert all(s.lost == 0 for s in joined)
    assert joined[-1].loss < joined[0].loss
    # the peers did not start over: one consecutive run of iterations, on past the restart
    assert [s.iteration for s in after] == list(range(after[0].iteration, after[0].iteration + len(after)))
    assert after[-1].iteration > last_seen + 2
    # the restarted coordinator accounts again what the reports still hold (from the epoch the
    # swarm ran, stored beside the newest): the same figures as the first one's
    first = {s.iteration: s for s in joined}
    def counts(s):
        return s.completed, s.rerouted, s.skipped_stage, s.reissued, s.lost
    again = [s for s in after if s.iteration in first]
    assert all(counts(s) == counts(first[s.iteration]) for s in again), \
        [(s.iteration, counts(s), counts(first[s.iteration])) for s in again]
    new = [s for s in after if s.iteration > last_seen]
    assert new and all(s.lost == 0 and s.completed > 0 for s in new), [(s.iteration, counts(s)) for s in new]
