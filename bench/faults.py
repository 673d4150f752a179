"""Faults as a bench (issue 25): one 6-peer swarm on 127.0.0.1 (3 stages, two replicas each,
skip ratio 1/3) through a scripted storm, one fault after another once the swarm is steady:

  hang       a stage-1 peer takes the forwards it is sent and drops them for --hang-s while
             answering pings (--fault hang): only hop deadlines catch it (first, when chosen:
             the peer is started with it, from iteration HANG_AT)
  pause      a stage-2 peer stopped with SIGSTOP for --pause-s, then resumed (SIGCONT)
  rejoin     a stage-1 peer killed with SIGKILL, restarted 5 s later (same identity and stage);
             like the next two, the phase's iterations count once the coordinator planned it back
  empty      both stage-2 peers killed at once, restarted 5 s later (the stage is empty meanwhile;
             skips carry the microbatches around it; they must come back with trained weights)
  restart    the coordinator stopped and a new one started (same organiser key, joining through
             a peer)
  liar       a stage-1 peer restarted computing 8x slower than its advert says, its measured
             speed included (--fault lie): only the origins' round trips show it

Per fault it prints: seconds from the fault until iterations are back within 20% of their
pre-fault time (the median of the 5 iterations before; "-" when they never were within the
phase), the microbatches lost, and whether a stage was re-initialised (a peer's log says it
started a stage from fresh weights; one that resumed from the stage's newest checkpoint is
counted apart, as what the stage learned since that checkpoint is lost). For the whole run: samples trained
twice or skipped (from the origins' reported sample positions). The machine's load average is
printed beside, since everything shares its cores.

  python bench/faults.py [--phase-iterations 10] [--pause-s 10] [--hang-s 8] [--only pause,restart]
Last line: RESULT recovery_s_max=... lost=... reinit_stages=... twice=... skipped=... unsummarised=... exited=... load=...
"""
import argparse
import asyncio
import collections
import logging
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.app import CoordinatorApp                    # noqa: E402
from coordinator.config import CoordinatorConfig              # noqa: E402
from coordinator.planner.costs import LOCAL_SWARM_OVERHEADS   # noqa: E402
from launcher.processes import start_peer                     # noqa: E402
from tokendata.cursor import expand_positions                 # noqa: E402
from bench.support.harness import LOOPBACK, planned_with, stop_processes, wait_for   # noqa: E402

FAULTS = ("hang", "pause", "rejoin", "empty", "restart", "liar")
HANG_AT, HANG_SLOT = 14, 4           # after the 8 warm-up iterations, with hop deadlines measured
STAGES = [0, 1, 2, 0, 1, 2]          # peer i hosts stage i mod 3: origins 0 and 3
WITHIN = 1.2                         # "back to normal": within 20% of the pre-fault time
FRESH_MARKS = ("starts from FRESH weights",)      # peer/pipeline/seat.py's error lines
# a stage that went on from a checkpoint: at a late start (seat.py), or after falling behind
# with no replica to copy (rejoin.py; its peer resumed from the checkpoint at start-up)
CHECKPOINT_MARKS = ("from its checkpoint of iteration", "gave its state after we fell behind")
JOINED = re.compile(r"joined run .* as (\w+)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase-iterations", type=int, default=10, help="iterations to watch after each fault")
    p.add_argument("--pause-s", type=float, default=10.0, help="how long the paused peer stays stopped")
    p.add_argument("--hang-s", type=float, default=8.0, help="how long the hung peer drops its forwards")
    p.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    p.add_argument("--phase-timeout", type=float, default=240.0, help="give up on a phase after this long")
    p.add_argument("--logs-dir", type=Path, default=None, help="keep the peers' logs here (default: a temporary "
                                                               "folder, removed at the end)")
    args = p.parse_args()
    # the hung peer hangs from HANG_AT by itself, before any other fault: its phase comes first
    args.faults = sorted((f.strip() for f in args.only.split(",") if f.strip()), key=lambda f: f != "hang")
    unknown = set(args.faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown fault(s) {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    return args


class Storm:
    """The swarm under test: an in-process coordinator (replaceable) and peer processes by slot."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.rows: dict[int, object] = {}          # iteration -> IterationSummary, across coordinators
        self.procs: dict[int, object] = {}
        self.logs: dict[int, Path] = {}
        self.app: CoordinatorApp | None = None
        self.task: asyncio.Task | None = None
        self.key = str(tmp / "organiser.pem")

    def _record(self, summary) -> None:
        self.rows.setdefault(summary.iteration, summary)

    async def start_coordinator(self, initial_peers: tuple[str, ...] = ()) -> None:
        config = CoordinatorConfig(run="storm", host_maddrs=LOOPBACK, num_stages=3, skip_ratio=1 / 3, min_peers=6,
                                   microbatch_samples=4, seq_len=64, microbatches_per_origin=4, max_steps=100000,
                                   organiser_key_path=self.key, initial_peers=initial_peers,
                                   checkpoint_dir=str(self.tmp / "checkpoints"), overheads=LOCAL_SWARM_OVERHEADS)
        self.app = CoordinatorApp(config, on_iteration=self._record)
        self.app.adjust_topology = planned_with(set())   # the liar's advert says it is as fast as the rest
        self.task = asyncio.create_task(self.app.run())
        await asyncio.wait_for(self.app.ready.wait(), 60)

    async def stop_coordinator(self) -> None:
        self.app.stop.set()
        await asyncio.wait_for(self.task, 30)

    def start_peer(self, slot: int, *extra: str) -> None:
        args = ["--initial-peers", *self.app.maddrs, "--run", self.app.run_address, "--device", "cpu",
                "--host-maddrs", *LOOPBACK, "--cache-dir", str(self.tmp / "cache"),
                "--identity", str(self.tmp / f"peer{slot}.key"), "--stage", str(STAGES[slot]),
                "--checkpoint-dir", str(self.tmp / "checkpoints"), *extra]
        log, n = self.tmp / f"peer{slot}.log", 1
        while log.exists():           # a restarted peer keeps the log of the one it replaces
            log, n = self.tmp / f"peer{slot}.{n}.log", n + 1
        self.procs[slot] = start_peer(args, log)
        self.logs[slot] = log

    async def back_in_plan(self, slots: list[int], timeout: float) -> None:
        """Until each restarted peer has joined and the coordinator's schedule includes it: the
        phase then measures the swarm with it back (a peer still starting up proves nothing)."""
        def ids():
            found = [JOINED.search(self.logs[s].read_text(errors="replace")) for s in slots]
            return [m.group(1) for m in found] if all(found) else None

        def planned():
            joined = ids()
            return joined is not None and self.app.schedule is not None and \
                all(p in self.app.schedule.stage_of() for p in joined)

        def running():   # the epoch with them in it has begun (it starts a few seconds ahead)
            return planned() and self.newest() + 1 >= self.app.schedule.start_iteration
        await wait_for(planned, timeout, f"restarted peer(s) {slots} in the plan")
        await wait_for(running, timeout, f"the epoch with restarted peer(s) {slots} running")

    def signal(self, slot: int, sig: int) -> None:
        os.killpg(self.procs[slot].pid, sig)            # its own session: the group is its pid

    def kill(self, slot: int) -> None:
        self.signal(slot, signal.SIGKILL)
        self.procs[slot].wait(10)

    def newest(self) -> int:
        return max(self.rows, default=-1)

    async def iterations(self, count: int, timeout: float) -> None:
        target = self.newest() + count
        await wait_for(lambda: self.newest() >= target, timeout, f"{count} more iterations")

    def log_count(self, marks: tuple[str, ...]) -> int:
        texts = [log.read_text(errors="replace") for log in self.tmp.glob("peer*.log")]
        return sum(text.count(mark) for text in texts for mark in marks)


async def inject(storm: Storm, fault: str, args) -> None:
    if fault == "hang":
        return                # the peer was started with it (run_storm)
    if fault == "pause":
        storm.signal(2, signal.SIGSTOP)
        await asyncio.sleep(args.pause_s)
        storm.signal(2, signal.SIGCONT)
    elif fault == "rejoin":
        storm.kill(1)
        await asyncio.sleep(5)
        storm.start_peer(1)
        await storm.back_in_plan([1], args.phase_timeout)
    elif fault == "empty":
        storm.kill(2)
        storm.kill(5)
        await asyncio.sleep(5)
        storm.start_peer(2)
        storm.start_peer(5)
        await storm.back_in_plan([2, 5], args.phase_timeout)
    elif fault == "restart":
        maddrs = [a for adv in (await storm.app.records.get_adverts()).values() for a in adv.maddrs
                  if "127.0.0.1" in a]
        await storm.stop_coordinator()
        await asyncio.sleep(2)
        await storm.start_coordinator(tuple(maddrs[:2]))
    elif fault == "liar":
        storm.kill(4)
        storm.start_peer(4, "--fault", "stall@0:8,lie@0:8")
        await storm.back_in_plan([4], args.phase_timeout)


def measure(storm: Storm, fault: str, fault_at: float, first: int, marks_before: tuple[int, int],
            finished: bool) -> dict:
    """One fault's figures; a phase that never got its iterations did not recover (None)."""
    rows = [storm.rows[i] for i in sorted(storm.rows)]
    before = [r.duration_s for r in rows if r.iteration < first][-5:]
    after = [r for r in rows if r.iteration >= first]
    normal = statistics.median(before) if before else float("nan")
    recovered = None
    for k, r in enumerate(after if finished else []):
        if all(x.duration_s <= WITHIN * normal for x in after[k:k + 2]) and r.started_at >= fault_at - normal:
            recovered = max(0.0, r.started_at - fault_at)
            break
    return {"fault": fault, "normal_s": normal, "recovery_s": recovered, "lost": sum(r.lost for r in after),
            "slowest_s": max((r.duration_s for r in after), default=0.0), "iterations": len(after),
            "exited": sorted(slot for slot, proc in storm.procs.items() if proc.poll() is not None),
            "reinit": storm.log_count(FRESH_MARKS) - marks_before[0],
            "from_checkpoint": storm.log_count(CHECKPOINT_MARKS) - marks_before[1]}


def data_integrity(storm: Storm) -> tuple[int, int, int]:
    """(samples trained twice, samples skipped, iterations nobody summarised). Skipped: within
    each run of consecutive summarised iterations, positions between the lowest and the highest
    trained that none trained and the coordinator does not owe (lost, to train again). A
    restarted coordinator summarises from its schedule's first iteration on: the iterations
    between are trained but unread, and counted apart."""
    counts = collections.Counter(p for r in storm.rows.values() for p in expand_positions(r.positions))
    owed = storm.app.ledger.lost_positions if storm.app else set()
    twice = sum(1 for c in counts.values() if c > 1)
    iterations = sorted(storm.rows)
    unread = sum(b - a - 1 for a, b in zip(iterations, iterations[1:]))
    skipped = 0
    for block in consecutive_runs(iterations):
        trained = {p for i in block for p in expand_positions(storm.rows[i].positions)}
        if trained:
            skipped += sum(1 for p in range(min(trained), max(trained)) if p not in counts and p not in owed)
    return twice, skipped, unread


def consecutive_runs(iterations: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in iterations:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


async def run_storm(args, tmp: Path) -> list[dict]:
    storm = Storm(tmp)
    await storm.start_coordinator()
    results = []
    try:
        for slot in range(len(STAGES)):
            hang = ("--fault", f"hang@{HANG_AT}:{args.hang_s}") if slot == HANG_SLOT and "hang" in args.faults else ()
            storm.start_peer(slot, *hang)
        await storm.iterations(8, 300)
        for fault in args.faults:
            if fault == "hang":      # the peer hangs by itself from HANG_AT: the phase starts there
                if storm.newest() >= HANG_AT - 1:
                    print(f"   (the warm-up ran past iteration {HANG_AT}: the hang began before its phase)")
                await wait_for(lambda: storm.newest() >= HANG_AT - 1, args.phase_timeout, f"iteration {HANG_AT}")
            first, fault_at = storm.newest() + 1, time.time()
            marks_before = storm.log_count(FRESH_MARKS), storm.log_count(CHECKPOINT_MARKS)
            print(f"-- {fault} at iteration ~{first} (load {os.getloadavg()[0]:.1f})", flush=True)
            finished = True
            try:
                await inject(storm, fault, args)
                await storm.iterations(args.phase_iterations, args.phase_timeout)
            except AssertionError as exc:      # a phase that never recovers is a result, not a crash
                print(f"   {fault}: {exc}", flush=True)
                finished = False
            results.append(measure(storm, fault, fault_at, first, marks_before, finished))
            print_row(results[-1])
            print_witnessed(storm)
        results.append({"integrity": data_integrity(storm)})
    finally:
        stop_processes(list(storm.procs.values()))
        await storm.stop_coordinator()
    return results


def print_witnessed(storm: Storm) -> None:
    """What the origins' round trips say of each peer (coordinator/witnessed_speed.py), by slot."""
    slot_of = {}
    for slot, log in storm.logs.items():
        found = JOINED.search(log.read_text(errors="replace"))
        if found:
            slot_of[found.group(1)] = slot
    times = storm.app.witness.times()
    print("   witnessed s/round trip by slot: " + (", ".join(
        f"{slot_of.get(p, p[:8])}: {s:.3f}" for p, s in sorted(times.items(), key=lambda kv: str(slot_of.get(kv[0]))))
        or "none identified") + f"; demoted: {storm.app.slow_peers.describe()}", flush=True)


def print_row(r: dict) -> None:
    rec = "-" if r["recovery_s"] is None else f"{r['recovery_s']:.1f}"
    print(f"   {r['fault']:8s} normal {r['normal_s']:.2f} s  back within 20% after {rec} s  slowest {r['slowest_s']:.1f} s"
          f"  lost {r['lost']}  fresh stages {r['reinit']}  from a checkpoint {r['from_checkpoint']}"
          f"  ({r['iterations']} iterations)", flush=True)
    if r["exited"]:   # e.g. a restarted peer that could not join: the phase did not test what it says
        print(f"   peers that exited: {r['exited']} (their logs: peerN*.log)", flush=True)


def log_coordinator(path: Path) -> None:
    """The in-process coordinators' INFO lines (epochs published, schedules followed) to a file
    beside the peers' logs: the console keeps only the figures and warnings."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("skippipe.coordinator", "coordinator"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)


def main() -> int:
    args = parse_args()
    load = os.getloadavg()
    print(f"faults bench on {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="faults-bench-") as tmp:
        folder = args.logs_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        log_coordinator(folder / "coordinator.log")
        results = asyncio.run(run_storm(args, folder))
    rows, (twice, skipped, unread) = results[:-1], results[-1]["integrity"]
    recoveries = [r["recovery_s"] for r in rows]
    worst = -1.0 if any(x is None for x in recoveries) else max(recoveries, default=0.0)
    print(f"samples trained twice: {twice}; skipped: {skipped}; iterations no coordinator summarised: {unread}")
    print(f"RESULT recovery_s_max={worst:.1f} lost={sum(r['lost'] for r in rows)} "
          f"reinit_stages={sum(r['reinit'] for r in rows)} twice={twice} skipped={skipped} unsummarised={unread} "
          f"faults={len(rows)} exited={len(rows[-1]['exited']) if rows else 0} load={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
