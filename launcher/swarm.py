"""One local swarm run: the coordinator in this process, the peers as subprocesses on
127.0.0.1; every process it started is gone when it returns."""
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.planner.costs import LOCAL_SWARM_OVERHEADS
from coordinator.run_args import hivemind_logs_as, run_config_fields

from launcher.emulated_topology import assign_nodes, with_emulated_links
from launcher.pauses import Pauser
from launcher.peer_args import LOOPBACK, Emulation, peer_argv
from launcher.processes import benchmark_once, prepare_peer_starts, start_peer, terminate_processes, wait_or_kill
from launcher.summary import ProgressPrinter, ban_summary, data_summary, ran_schedule, summary_dict, write_plan_files

PEER_STOP_GRACE_S = 3.5    # the peers were told at once; each has its own 4 s watchdog
COORDINATOR_UP_S = 60


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read it: {exc})"


async def _event_or_end(event: asyncio.Event, coordinator: asyncio.Task, timeout_s: float) -> None:
    """Until `event` is set or the coordinator's task ends, for at most `timeout_s`."""
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait({waiter, coordinator}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


async def coordinator_ready(app, coordinator: asyncio.Task, timeout_s: float) -> bool:
    """Whether the coordinator came up; False when it ended first (stopped, or failed)."""
    await _event_or_end(app.ready, coordinator, timeout_s)
    if app.ready.is_set():
        return True
    if not coordinator.done():
        print(f"skippipe-swarm: error: the coordinator did not come up within {timeout_s:.0f}s", file=sys.stderr)
    return False


async def startup_failure(peers, app, logs: Path, coordinator: asyncio.Task, deadline: float,
                          poll_s: float = 0.5) -> str | None:
    """Until the first schedule is out: why the swarm cannot start, if a peer process exited
    (the planner waits for every peer, so it would otherwise wait out --timeout). None once
    planned, or when the coordinator ends or `deadline` (monotonic) passes first."""
    while app.schedule is None and not coordinator.done() and time.monotonic() < deadline:
        for i, p in enumerate(peers):
            if p.poll() is not None:
                log = logs / f"peer{i}.log"
                return (f"peer {i} exited with code {p.returncode} before the swarm started; "
                        f"the end of {log}:\n{log_tail(log)}")
        await asyncio.sleep(poll_s)
    return None


def coordinator_config(args, logs: Path) -> CoordinatorConfig:
    return CoordinatorConfig(**run_config_fields(args), host_maddrs=(LOOPBACK,), min_peers=args.peers,
                             switch_margin_s=args.switch_margin,
                             organiser_key_path=str(logs / "organiser.pem"),   # the peers pin it (--run NAME@KEY)
                             overheads=LOCAL_SWARM_OVERHEADS)   # every peer on this one machine: its measured fixed costs


async def prepare_emulation(args, app, logs: Path) -> Emulation | None:
    """--topology: every peer's node and identity, and the planner's view of the emulated links."""
    if args.topology_data is None:
        return None
    nodes, node_map, map_path = assign_nodes(args.topology_data, logs / "emulation")
    app.adjust_topology = lambda t: with_emulated_links(t, args.topology_data, node_map)
    print(f"emulating {args.topology} ({len(nodes)} nodes) on the peers' links", flush=True)
    if not args.chaos:   # the planner's compute figures: measured once on a quiet box (peer/benchmark_cli.py)
        print(await asyncio.to_thread(benchmark_once, args.model, args.microbatch_samples, args.seq_len), flush=True)
    return Emulation(nodes, map_path)


async def run_ended(app, coordinator: asyncio.Task, timeout_s: float) -> None:
    """Until the run's last iteration is summarised or the coordinator ends (stopped, failed):
    the peers are then told to leave while the coordinator still closes its DHT (~1.5 s), not
    after. TimeoutError when neither happens within `timeout_s`."""
    await _event_or_end(app.ended, coordinator, timeout_s)
    if coordinator.done():
        coordinator.result()           # its failure is the run's
    elif not app.ended.is_set():
        raise TimeoutError


async def supervise(args, app, logs: Path, emulation: Emulation | None, started: float,
                    peers: list, pauser: Pauser) -> bool:
    """Run the coordinator and the peers (started into `peers`) until the run ends, a peer fails
    to start or --timeout passes, then stop them all. False when the coordinator never came up."""
    forks_ready = asyncio.create_task(asyncio.to_thread(prepare_peer_starts))   # while the coordinator starts
    coordinator = asyncio.create_task(app.run())
    try:
        if not await coordinator_ready(app, coordinator, timeout_s=COORDINATOR_UP_S):
            return False
        await forks_ready
        print(f"coordinator up at {app.maddrs[0]}; starting {args.peers} peers (logs in {logs})", flush=True)
        if app.http is not None:
            print(f"status page: {app.http.url}", flush=True)
        for i in range(args.peers):
            argv = peer_argv(args, i, app.maddrs, emulation, run=app.run_address)
            peers.append(start_peer(argv, logs / f"peer{i}.log"))
        failure = await startup_failure(peers, app, logs, coordinator, started + args.timeout)
        if failure:
            print(f"skippipe-swarm: error: {failure}", file=sys.stderr)
        else:
            await run_ended(app, coordinator, timeout_s=max(0.0, started + args.timeout - time.monotonic()))
    except TimeoutError:
        print(f"skippipe-swarm: error: the run did not finish within {args.timeout:.0f}s; peer logs are in {logs}",
              file=sys.stderr)
    finally:
        signalled = app.stop.is_set()   # Ctrl-C / SIGTERM: everything must be gone within 5 s
        app.stop.set()
        pauser.resume_all()             # a stopped peer cannot leave
        terminate_processes(peers)      # the peers and the coordinator leave side by side
        # the warm-up is awaited even when the coordinator failed first: its error is not left unread
        await asyncio.gather(coordinator, forks_ready, return_exceptions=True)
        await asyncio.to_thread(wait_or_kill, peers, PEER_STOP_GRACE_S if signalled else 10.0)
    return True


def report(args, app, wall_s: float) -> dict:
    """Print the run's summary (and write it with --summary-json); returns it."""
    summary = summary_dict(app.summaries, args, wall_s, app.replans)
    ran = ran_schedule(app, app.summaries)
    summary["predicted_iteration_s"] = ran.predicted_iteration_s if ran else None
    summary["predicted_epoch"] = ran.epoch if ran else None
    summary.update(ban_summary(app))
    summary["data"] = data_summary(app)
    print(f"done: {summary['steps']} iterations, loss {summary['first_loss']} -> {summary['last_loss']}, "
          f"{summary['tokens_per_s']:.0f} tokens/s, microbatches {summary['microbatches']}", flush=True)
    if args.spot_check_rate or summary["banned"]:
        print(f"spot checks: {summary['spot_checks']['passed']} passed, {summary['spot_checks']['failed']} failed; "
              f"banned: {summary['banned'] or 'none'}", flush=True)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=1))
        write_plan_files(ran, app.topology, args.summary_json)
    return summary


async def run_swarm(args, stop: asyncio.Event | None = None) -> int:
    from coordinator.app import CoordinatorApp  # hivemind: only once the flags are valid
    hivemind_logs_as(args.log_format)
    logs = args.logs_dir or Path(tempfile.mkdtemp(prefix="skippipe-swarm-"))
    logs.mkdir(parents=True, exist_ok=True)
    peers: list = []
    pauser = Pauser(getattr(args, "pauses", []), peers)
    printer = ProgressPrinter(args.steps, args.stages)

    def on_iteration(summary) -> None:
        printer(summary)
        pauser.on_iteration(summary.iteration)
    app = CoordinatorApp(coordinator_config(args, logs), on_iteration=on_iteration, run_data=args.run_data, stop=stop)
    emulation = await prepare_emulation(args, app, logs)
    started = time.monotonic()
    if not await supervise(args, app, logs, emulation, started, peers, pauser):
        return 1
    summary = report(args, app, time.monotonic() - started)
    finished = summary["last_iteration"] == args.steps - 1
    if not args.logs_dir and finished:
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if finished else 1
