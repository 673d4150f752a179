"""`skippipe-swarm`: a whole local swarm (coordinator + N peers) on this machine, on 127.0.0.1."""
import argparse
import asyncio
import collections
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from protocol.errors import ProtocolError
from protocol.messages import SHARE_DTYPES
from protocol.topology import load_topology
from swarmcore.cli.support import (DEFAULT_SKIP, OneLineErrorParser, add_version_flag, fail_usage,
                                  positive_int, run_name, skip_ratio)
from swarmcore.cli.logsetup import add_logging_flags, setup_logging
from swarmcore.cli.settings import add_config_flag, apply_settings, port_or_off
from opsweb.stopping import run_until_stopped

from modelconfig import ConfigError, check_stages, resolve_model, to_spec_json

from coordinator.chaos_spec import ChaosSpecError, parse_chaos
from coordinator.cli import add_data_arguments, resolve_data_or_exit
from coordinator.config import CoordinatorConfig
from coordinator.emulated_topology import assign_nodes, with_emulated_links
from coordinator.planner.costs import LOCAL_SWARM_OVERHEADS
from coordinator.local_swarm import benchmark_once, start_peer, terminate_processes, wait_or_kill
from coordinator.progress import IterationSummary
from tokendata.cursor import expand_positions

logger = logging.getLogger("skippipe.swarm")
DESCRIPTION = """\
Start a complete SkipPipe swarm on this machine: a coordinator and N volunteer peers as
separate processes talking over real hivemind P2P on 127.0.0.1. It trains the chosen model
on the embedded Shakespeare corpus, shows progress, prints a summary, and stops every
process it started.
"""
PEER_STOP_GRACE_S = 3.5    # the peers were told at once; each has its own 4 s watchdog
EPILOG = "example:\n  skippipe-swarm --peers 6 --stages 3 --steps 20 --skip 1/3 --model tiny\n"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-swarm", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=positive_int, default=6, help="number of peer processes (default: 6)")
    p.add_argument("--stages", type=positive_int, default=3, help="pipeline stages (default: 3)")
    p.add_argument("--steps", type=positive_int, default=20, help="training iterations (default: 20)")
    p.add_argument("--skip", type=skip_ratio, default=skip_ratio(DEFAULT_SKIP), metavar="K",
                   help=f"skip ratio k in [0, 1), e.g. 0.33 or 1/3; 0 is the full pipeline (default: {DEFAULT_SKIP})")
    p.add_argument("--strategy", choices=["skippipe", "full", "random-skip"], default="skippipe")
    add_data_arguments(p)
    p.add_argument("--model", default="tiny", metavar="NAME|config.json",
                   help="model preset (tiny, small, 500m, 1.5b) or a Hugging Face LlamaConfig config.json (default: tiny)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--microbatches", type=positive_int, default=4, help="microbatches per stage-0 peer per iteration")
    p.add_argument("--microbatch-samples", type=positive_int, default=4)
    p.add_argument("--seq-len", type=positive_int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--run", type=run_name, default="local", help="run name (default: local)")
    p.add_argument("--checkpoint-dir", type=Path, help="per-stage checkpoints; rerun with the same dir to resume")
    p.add_argument("--save-every", type=positive_int, default=1, metavar="N",
                   help="with --checkpoint-dir: save after every N-th iteration and the last (default: 1)")
    p.add_argument("--keep-last", type=positive_int, default=2, metavar="K",
                   help="with --checkpoint-dir: checkpoints kept per stage (default: 2)")
    p.add_argument("--summary-json", type=Path, metavar="FILE", help="write the run summary as JSON")
    p.add_argument("--logs-dir", type=Path, help="keep peer logs here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds (default: 900)")
    p.add_argument("--status-port", type=port_or_off, default=None, metavar="PORT|off",
                   help="serve the coordinator's status page on 127.0.0.1:PORT (0: any free port; default: off)")
    p.add_argument("--announce-period", type=float, default=1.5, metavar="S",
                   help="peers' advert period; a peer is taken as departed after twice this (default: 1.5; "
                        "raise it on a heavily loaded machine, where late adverts look like departures)")
    p.add_argument("--switch-margin", type=float, default=4.0, metavar="S",
                   help="a new schedule epoch takes effect this many seconds of iterations after it is published, "
                        "so that every peer has read it by then (default: 4; lower re-plans sooner)")
    p.add_argument("--topology", type=Path, metavar="T.json",
                   help="emulate this topology file's links and compute slowdowns (one peer per node; "
                        "--peers defaults to its node count); the coordinator plans with its links")
    p.add_argument("--join-key", type=Path, metavar="FILE",
                   help="require this join secret (created if missing) and give it to every peer")
    p.add_argument("--chaos", default="", metavar="SPEC",
                   help="inject faults to watch recovery, e.g. kill:1@iter3,stall:2@iter5 (peer index, "
                        "iteration; kill:P@iterN:backward kills mid-backward; corrupt:P@iterN sends wrong "
                        "activations). Peers then get stages round-robin (peer P hosts stage P mod --stages) "
                        "so you know whom you hit, and skip the layer benchmark (all equally fast to "
                        "the planner; --topology slowdowns still apply)")
    p.add_argument("--share-dtype", choices=SHARE_DTYPES, default=None,
                   help="every peer's --share-dtype: the gradients replicas exchange each iteration "
                        "(default: the peers' own default)")
    p.add_argument("--spot-check-rate", type=float, default=0.0, metavar="F",
                   help="every peer's --spot-check-rate: share of forwards recomputed on another replica "
                        "(default: 0, off)")
    add_logging_flags(p, "WARNING")
    add_config_flag(p)
    add_version_flag(p)
    return p


class ProgressPrinter:
    def __init__(self, steps: int, stages: int):
        self.steps, self.stages = steps, stages

    def __call__(self, s: IterationSummary) -> None:
        width = 24
        filled = min(width, int(width * (s.iteration + 1) / self.steps))
        bar = "#" * filled + "-" * (width - filled)
        # share of (microbatch, stage) pairs a full pipeline would have visited but we skipped
        ended = s.completed + s.rerouted + s.skipped_stage + s.reissued
        skipped = 1 - s.stages_visited / (ended * self.stages) if ended else 0.0
        line = (f"[{bar}] iter {s.iteration + 1}/{self.steps} loss {s.loss:.3f} "
                f"{s.tokens / max(s.duration_s, 1e-9):7.0f} tok/s {s.duration_s:5.2f}s/iter "
                f"stages skipped {100 * skipped:4.1f}% lost {s.lost}")
        recovered = [f"{name} {n}" for name, n in (("rerouted", s.rerouted), ("skipped-stage", s.skipped_stage),
                                                   ("reissued", s.reissued)) if n]
        if recovered:
            line += " | recovered: " + ", ".join(recovered)
        print(line, flush=True)


def iteration_rows(summaries: list[IterationSummary]) -> list[dict]:
    return [{"iteration": s.iteration, "epoch": s.epoch, "loss": s.loss, "started_at": s.started_at,
             "duration_s": s.duration_s, "completed": s.completed, "rerouted": s.rerouted,
             "skipped_stage": s.skipped_stage, "reissued": s.reissued, "lost": s.lost,
             "lost_microbatches": list(s.lost_microbatches), "positions": list(s.positions)} for s in summaries]


def summary_dict(summaries: list[IterationSummary], args, wall_s: float, replans: list[dict] = ()) -> dict:
    tokens = sum(s.tokens for s in summaries)
    busy = sum(s.duration_s for s in summaries)
    return {
        "steps": len(summaries),
        "first_iteration": summaries[0].iteration if summaries else None,
        "last_iteration": summaries[-1].iteration if summaries else None, "peers": args.peers, "stages": args.stages, "skip": args.skip,
        "strategy": args.strategy, "model": args.arch.name,
        "first_loss": summaries[0].loss if summaries else None,
        "last_loss": summaries[-1].loss if summaries else None,
        "losses": [s.loss for s in summaries],
        "tokens_per_s": tokens / busy if busy else 0.0,
        "mean_iteration_s": busy / len(summaries) if summaries else None,
        "wall_s": wall_s,
        "microbatches": {k: sum(getattr(s, k) for s in summaries)
                         for k in ("completed", "rerouted", "skipped_stage", "reissued", "lost")},
        "iterations": iteration_rows(summaries),
        "replans": list(replans),
    }


def data_summary(app) -> dict:
    """What the run trained on, and the lost samples not yet trained again (still owed)."""
    trained = {p for s in app.summaries for p in expand_positions(s.positions)}
    owed = app.ledger.lost_positions - trained
    return {"dataset_id": app.spec.dataset_id, "tokenizer": app.spec.tokenizer,
            "tokenizer_hash": app.spec.tokenizer_hash, "lost_samples": app.ledger.lost_total,
            "owed_samples": sorted(owed)}


def ban_summary(app) -> dict:
    return {"banned": dict(app.bans.banned), "spot_checks": dict(app.bans.counts)}


def main_epoch(summaries: list[IterationSummary]) -> int | None:
    """The epoch most iterations ran under (the later one on a tie). Its schedule is the one
    to compare with what was measured: peers leaving at the end of a run trigger re-plans
    whose schedules never ran."""
    counts = collections.Counter(s.epoch for s in summaries)
    return max(counts, key=lambda e: (counts[e], e)) if counts else None


def ran_schedule(app, summaries: list[IterationSummary]):
    epoch = main_epoch(summaries)
    return next((s for s in app.schedules if s.epoch == epoch), app.schedule)


def write_plan_files(schedule, topology, summary_json: Path) -> None:
    """The schedule most iterations ran (ran_schedule) and the topology of the last plan,
    next to the summary (S.json -> S.schedule.json, S.topology.json): the simulator can then be
    re-run on what was measured."""
    if schedule is None or topology is None:
        return
    from protocol.schedule import schedule_to_json
    from protocol.topology import topology_to_json
    summary_json.with_suffix(".schedule.json").write_text(schedule_to_json(schedule))
    summary_json.with_suffix(".topology.json").write_text(topology_to_json(topology))


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read it: {exc})"


async def coordinator_ready(app, coordinator: asyncio.Task, timeout_s: float) -> bool:
    """Whether the coordinator came up; False when it ended first (stopped, or failed)."""
    ready = asyncio.create_task(app.ready.wait())
    try:
        await asyncio.wait({ready, coordinator}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
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


async def run_swarm(args, stop: asyncio.Event | None = None) -> int:
    from coordinator.app import CoordinatorApp  # hivemind: only once the flags are valid
    from coordinator.cli import hivemind_logs_as
    hivemind_logs_as(args.log_format)
    config = CoordinatorConfig(
        run=args.run, model=args.arch.name, model_config=to_spec_json(args.arch), num_stages=args.stages, skip_ratio=args.skip, strategy=args.strategy,
        seed=args.seed, max_steps=args.steps, microbatch_samples=args.microbatch_samples, seq_len=args.seq_len,
        microbatches_per_origin=args.microbatches, learning_rate=args.lr,
        host_maddrs=("/ip4/127.0.0.1/tcp/0",), min_peers=args.peers,
        join_key_path=str(args.join_key) if args.join_key else "", status_port=args.status_port,
        data_dir=args.data, tokenizer=args.tokenizer,
        checkpoint_dir=str(args.checkpoint_dir) if args.checkpoint_dir else "", switch_margin_s=args.switch_margin,
        overheads=LOCAL_SWARM_OVERHEADS)   # every peer on this one machine: its measured fixed costs
    printer = ProgressPrinter(args.steps, args.stages)
    app = CoordinatorApp(config, on_iteration=printer, run_data=args.run_data, stop=stop)
    logs = args.logs_dir or Path(tempfile.mkdtemp(prefix="skippipe-swarm-"))
    logs.mkdir(parents=True, exist_ok=True)
    emulated = []   # (node id, identity file) per peer, with --topology
    if args.topology_data is not None:
        emulated, node_map, map_path = assign_nodes(args.topology_data, logs / "emulation")
        app.adjust_topology = lambda t: with_emulated_links(t, args.topology_data, node_map)
        print(f"emulating {args.topology} ({len(emulated)} nodes) on the peers' links", flush=True)
        if not args.chaos:   # the planner's compute figures: measured once on a quiet box (peer/benchmark_cli.py)
            print(await asyncio.to_thread(benchmark_once, args.model, args.microbatch_samples, args.seq_len), flush=True)
    coordinator = asyncio.create_task(app.run())
    peers = []
    started = time.monotonic()
    try:
        if not await coordinator_ready(app, coordinator, timeout_s=60):
            return 1
        print(f"coordinator up at {app.maddrs[0]}; starting {args.peers} peers (logs in {logs})", flush=True)
        if app.http is not None:
            print(f"status page: {app.http.url}", flush=True)
        for i in range(args.peers):
            peer_args = ["--initial-peers", *app.maddrs, "--run", args.run, "--device", "cpu",
                         "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--log-level", args.log_level,
                         "--log-format", args.log_format,
                         "--public-name", f"local-{i}", "--announce-period", str(args.announce_period),
                         # stay until we stop them: a peer that leaves early can take its last report along
                         "--linger", "60"]
            if args.checkpoint_dir:
                peer_args += ["--checkpoint-dir", str(args.checkpoint_dir), "--save-every", str(args.save_every),
                              "--keep-last", str(args.keep_last)]
            if args.spot_check_rate:
                peer_args += ["--spot-check-rate", str(args.spot_check_rate)]
            if args.share_dtype:
                peer_args += ["--share-dtype", args.share_dtype]
            if args.join_key:
                peer_args += ["--join-key", str(args.join_key)]
            if emulated:
                node_id, identity = emulated[i]
                peer_args += ["--identity", str(identity), "--topology", str(args.topology), "--node-id", node_id,
                              "--node-map", str(map_path),
                              # the planner reads these links from the file; a probe's 3 x 1 MiB
                              # each way would only load the emulated links the run measures
                              "--link-probe-period", "0"]
                if args.topology_data.nodes[i].stage >= 0 and not args.chaos:
                    peer_args += ["--stage", str(args.topology_data.nodes[i].stage)]
            if args.chaos:
                # equal peers must look equal to the planner, so that the victims have work: a
                # benchmark run by six peers at once on a loaded box can read one 8x slower
                peer_args += ["--stage", str(i % args.stages), "--no-benchmark"]
                if i in args.faults:
                    peer_args += ["--fault", args.faults[i]]
            peers.append(start_peer(peer_args, logs / f"peer{i}.log"))
        failure = await startup_failure(peers, app, logs, coordinator, started + args.timeout)
        if failure:
            print(f"skippipe-swarm: error: {failure}", file=sys.stderr)
        else:
            await asyncio.wait_for(asyncio.shield(coordinator), timeout=max(0.0, started + args.timeout - time.monotonic()))
    except TimeoutError:
        print(f"skippipe-swarm: error: the run did not finish within {args.timeout:.0f}s; peer logs are in {logs}",
              file=sys.stderr)
    finally:
        signalled = app.stop.is_set()   # Ctrl-C / SIGTERM: everything must be gone within 5 s
        app.stop.set()
        terminate_processes(peers)      # the peers and the coordinator leave side by side
        await asyncio.gather(coordinator, return_exceptions=True)
        await asyncio.to_thread(wait_or_kill, peers, PEER_STOP_GRACE_S if signalled else 10.0)
    summary = summary_dict(app.summaries, args, time.monotonic() - started, app.replans)
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
    finished = summary["last_iteration"] == args.steps - 1
    if not args.logs_dir and finished:
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if finished else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    apply_settings(parser, argv, "swarm")
    args = parser.parse_args(argv)
    if not 0.5 <= args.switch_margin <= 600:
        return fail_usage("skippipe-swarm", f"--switch-margin must be between 0.5 and 600 seconds, got {args.switch_margin}")
    if not args.announce_period > 0:
        return fail_usage("skippipe-swarm", f"--announce-period must be > 0, got {args.announce_period}")
    args.topology_data = None
    if args.topology is not None:
        try:
            args.topology_data = load_topology(args.topology)
        except ProtocolError as exc:
            return fail_usage("skippipe-swarm", f"--topology: {exc}")
        nodes = len(args.topology_data.nodes)
        if any(a == "--peers" or a.startswith("--peers=") for a in argv) and args.peers != nodes:
            return fail_usage("skippipe-swarm", f"--topology has {nodes} nodes, one per peer, but --peers is {args.peers}")
        args.peers = nodes
    if not 0.0 <= args.spot_check_rate <= 1.0:
        return fail_usage("skippipe-swarm", f"--spot-check-rate must be between 0 and 1, got {args.spot_check_rate}")
    args.run_data = resolve_data_or_exit("skippipe-swarm", args)
    try:  # the model's vocabulary follows the run's tokenizer
        args.arch = resolve_model(args.model, args.run_data.vocab_size)
        check_stages(args.arch, args.stages)
    except ConfigError as exc:
        return fail_usage("skippipe-swarm", f"--model: {exc}" if exc.field != "--model" else str(exc))
    if args.stages > args.peers:
        return fail_usage("skippipe-swarm", f"--stages {args.stages} needs at least as many --peers (got {args.peers})")
    try:
        args.faults = parse_chaos(args.chaos, args.peers)
    except ChaosSpecError as exc:
        return fail_usage("skippipe-swarm", str(exc))
    setup_logging(args.log_level, args.log_format)
    from coordinator.planner.rules import describe_path
    k = 0.0 if args.strategy == "full" else args.skip   # `full` visits every stage whatever --skip says
    print(f"{args.strategy}, skip ratio {k:.4g}: {describe_path(args.stages, k)}", flush=True)
    return run_until_stopped(lambda stop: run_swarm(args, stop), "the swarm")


if __name__ == "__main__":
    sys.exit(main())
