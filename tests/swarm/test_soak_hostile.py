"""Soak: a small swarm trains for a few minutes while a rogue process sends a steady stream of
malformed and malicious requests at every peer and tries to forge adverts in the DHT.
Training must keep progressing with no lost microbatch, no peer may die, memory must stay flat,
and the coordinator must never see a forged advert. Bounded: 60 s of attack (SKIPPIPE_SOAK_S), about 3 minutes in all, 127.0.0.1 only."""
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.swarm.harness import coordinator, peers, wait_for
from tests.swarm.rogue import FORGED_SPEED

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
ATTACK_S = float(os.environ.get("SKIPPIPE_SOAK_S", "60"))
ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_rogue(maddrs, run, duration_s, rate, log_path, count=0) -> subprocess.Popen:
    log = open(log_path, "wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "tests.swarm.rogue", "--initial-peers", *maddrs, "--run", run,
                                 "--duration", str(duration_s), "--rate", str(rate), "--count", str(count)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def stop_rogue(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: its DHT child and p2pd too
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def test_training_survives_a_rogue_peer(tmp_path):
    async def scenario():
        async with coordinator(min_peers=3, num_stages=2, max_steps=0) as app:
            with peers(app, tmp_path, 3, "--announce-period", "2") as procs:
                await wait_for(lambda: len(app.summaries) >= 2, 150, "two iterations before the attack")
                genuine = set(await app.records.get_adverts())
                rogue = start_rogue(app.maddrs, app.config.run, ATTACK_S, 40, tmp_path / "rogue.log")
                try:
                    before = len(app.summaries)
                    await asyncio.sleep(min(30.0, ATTACK_S / 4))
                    rss_early = {p.pid: rss_mb(p.pid) for p in procs}
                    give_up = time.monotonic() + ATTACK_S + 60
                    while rogue.poll() is None and time.monotonic() < give_up:
                        await asyncio.sleep(2.0)
                        assert all(p.poll() is None for p in procs), "a peer died under attack"
                        adverts = await app.records.get_adverts()
                        assert not any(a.fwd_s_per_layer_sample == FORGED_SPEED
                                       for p, a in adverts.items() if p in genuine), "forged advert seen"
                    rss_late = {p.pid: rss_mb(p.pid) for p in procs}
                finally:
                    stop_rogue(rogue)
                report = (tmp_path / "rogue.log").read_text()
                sent = int(report.split("sent=")[1].split()[0]) if "sent=" in report else 0
                during = len(app.summaries) - before
                assert sent >= ATTACK_S * 10, report                  # the attack really ran
                assert during >= 3, f"only {during} iterations during the attack"
                assert all(s.lost == 0 for s in app.summaries), [s.lost for s in app.summaries]
                assert set(app.schedule.stage_of()) == genuine
                for pid, late in rss_late.items():
                    assert late < 1500 and late - rss_early[pid] < 150, (rss_early, rss_late)
                await wait_for(lambda: len(app.summaries) >= before + during + 1, 60, "training after the attack")
    asyncio.run(scenario())
