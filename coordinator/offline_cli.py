"""Offline planner subcommands: `plan`, `simulate`, `topology` (wired into coordinator/cli.py).

    skippipe-coordinator topology --preset geo --nodes 20 --seed 1 -o geo20.json
    skippipe-coordinator plan --topology geo20.json --skip 1/3 --strategy skippipe --seed 1 -o s.json
    skippipe-coordinator simulate s.json --topology geo20.json --json --gantt s.svg
"""
import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from coordinator.planner import STRATEGIES, PlanConfig, PlannerConfig, PlanningError, plan, simulate, validate
from coordinator.planner.bound import lower_bound
from coordinator.planner.steady import predict
from coordinator.planner.presets import PRESETS, make_topology
from coordinator.planner.rules import describe_path
from swarmcore.cli.support import DEFAULT_SKIP, non_negative_int, positive_int, skip_ratio
from protocol.errors import FieldError, ProtocolError
from protocol.quantised import WIRE_COMPRESSION
from protocol.schedule import schedule_from_json, schedule_to_json
from protocol.topology import load_topology, topology_to_json

PROG = "skippipe-coordinator"


class CliError(Exception):
    pass


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _fraction_0_1(text: str) -> str:
    """eval's --omit, checked here so that a typo is eval's one-line error (the evaluation
    itself runs in another process)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return text


def _write(path: str | None, text: str) -> None:
    if not path or path == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        Path(path).write_text(text + "\n")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None


def _guarded(handler):
    def run(args) -> int:
        try:
            return handler(args)
        except (CliError, PlanningError, ProtocolError, ValueError) as exc:
            return _fail(str(exc))
    return run


def cmd_plan(args) -> int:
    topo = load_topology(args.topology)
    planner = PlannerConfig(allow_swaps=not args.no_swaps, collision_avoidance=not args.no_collision_avoidance,
                            partitions=args.partitions)
    config = PlanConfig(args.strategy, args.skip, planner, args.run, args.epoch,
                        wire_compression=args.wire_compression)
    schedule = plan(topo, config, args.seed)
    _write(args.output, schedule_to_json(schedule))
    stages = sorted(set(schedule.stage_of().values()))
    sizes = [sum(1 for a in schedule.assignment if a.stage == s) for s in stages]
    length = len(schedule.routes[0].hops) if schedule.routes else 0
    k = 0.0 if args.strategy == "full" else args.skip   # `full` visits every stage whatever --skip says
    print(f"{args.strategy}, skip ratio {k:.4g}: {describe_path(topo.workload.num_stages, k)}",
          file=sys.stderr if not args.output or args.output == "-" else sys.stdout)
    out = sys.stderr if not args.output or args.output == "-" else sys.stdout
    print(f"{schedule.strategy}: {len(topo.nodes)} nodes, stage sizes {sizes}, {len(schedule.routes)} "
          f"microbatches x {length} stages, predicted iteration {schedule.predicted_iteration_s:.2f} s"
          f"{' -> ' + args.output if args.output and args.output != '-' else ''}", file=out)
    print(f"  {_bound_line(predict(schedule, topo).period_s, lower_bound(schedule, topo))}", file=out)
    return 0


def _bound_line(period_s: float, bound_s: float) -> str:
    gap = f"{period_s / bound_s:.2f}" if bound_s > 0 else "-"
    return f"steady period {period_s:.2f} s, lower bound {bound_s:.2f} s, gap {gap} (period / bound)"


def _load_schedule(path: str):
    try:
        return schedule_from_json(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except FieldError as exc:
        raise CliError(f"{path}: bad schedule: {exc}") from None


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("--gantt needs matplotlib: pip install 'skippipe-swarm[plot]' (or pip install matplotlib)") \
            from None


def cmd_simulate(args) -> int:
    if args.gantt:
        _need_matplotlib()   # before any work
    topo = load_topology(args.topology)
    schedule = _load_schedule(args.schedule)
    violations = validate(schedule, topo)
    result = simulate(schedule, topo)
    steady, bound = predict(schedule, topo), lower_bound(schedule, topo)
    report = {
        "strategy": schedule.strategy,
        "iteration_time_s": round(steady.iteration_s, 6),   # with the boundary, as plan (a span)
        "span_s": round(steady.iteration_s, 6),             # first origin's start to last origin's end
        "period_s": round(steady.period_s, 6),              # one iteration's start to the next one's
        "lower_bound_s": round(bound, 6),                   # coordinator/planner/bound.py
        "bound_gap": round(steady.period_s / bound, 4) if bound > 0 else None,
        "cold_iteration_s": round(result.iteration_time_s, 6),                # one iteration on idle nodes
        "predicted_iteration_s": schedule.predicted_iteration_s,
        "microbatches": len(schedule.routes),
        "path_lengths": sorted({len(r.hops) for r in schedule.routes}),
        "busy_fraction": {k: round(v, 4) for k, v in result.busy_fraction.items()},
        "mean_busy_fraction": round(sum(result.busy_fraction.values()) / max(1, len(result.busy_fraction)), 4),
        "stage_finish_s": {str(k): round(v, 6) for k, v in result.stage_finish_s.items()},
        "memory_overflows": result.memory_overflows,
        "violations": [v.to_plain() for v in violations],
    }
    if args.gantt:
        write_gantt(result, schedule, args.gantt, report["iteration_time_s"])
    if args.json:
        print(json.dumps(report))
    else:
        lengths = "/".join(map(str, report["path_lengths"])) or "-"
        print(f"{schedule.strategy}: iteration {report['iteration_time_s']:.2f} s, path length {lengths} of "
              f"{schedule.num_stages} stages, mean busy {report['mean_busy_fraction']:.0%}, "
              f"{len(violations)} violation(s)")
        print(f"  {_bound_line(steady.period_s, bound)}")
        for v in violations:
            print(f"  {v.kind.value}: {v.message}")
    return 0


def write_gantt(result, schedule, path: str, iteration_s: float) -> None:
    """One row per node (by stage), forward solid, backward hatched, head black; colour = microbatch.
    The title gives `iteration_s`, the steady-state time stdout prints; the bars are one
    iteration started on idle nodes (its own length said beside it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    stage_of = schedule.stage_of()
    nodes = sorted(result.busy_s, key=lambda n: (stage_of.get(n, 99), n))
    row = {n: i for i, n in enumerate(nodes)}
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.35 * len(nodes) + 1)))
    for iv in result.intervals:
        y, w = row[iv.node], iv.end - iv.start
        if iv.kind == "H":
            ax.barh(y, w, left=iv.start, height=0.8, color="black")
            continue
        ax.barh(y, w, left=iv.start, height=0.8, color=cmap(iv.microbatch_id % 20),
                hatch="//" if iv.kind == "B" else None, edgecolor="black" if iv.kind == "B" else "none",
                linewidth=0.3, alpha=0.75 if iv.kind == "B" else 1.0)
    ax.set_yticks(range(len(nodes)), [f"{n} (s{stage_of.get(n, '?')})" for n in nodes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{schedule.strategy}: iteration {iteration_s:.2f} s (steady state); "
                 f"drawn: one iteration from idle nodes, {result.iteration_time_s:.2f} s")
    ax.legend(handles=[Patch(facecolor=cmap(0), label="forward (colour = microbatch)"),
                       Patch(facecolor=cmap(0), hatch="//", edgecolor="black", alpha=0.75, label="backward"),
                       Patch(facecolor="black", label="head + loss")], loc="upper right", fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def cmd_topology(args) -> int:
    # what `plan` can use: every stage needs a node of its own, and every stage a layer
    if args.nodes < args.stages:
        raise CliError(f"--nodes {args.nodes} is fewer than --stages {args.stages}: `plan` needs at least "
                       "one node per stage")
    if args.layers < args.stages:
        raise CliError(f"--layers {args.layers} is fewer than --stages {args.stages}: every stage needs a layer")
    topo = make_topology(args.preset, args.nodes, random.Random(args.seed), stages=args.stages,
                         layers=args.layers, microbatch_samples=args.microbatch_samples,
                         microbatches=args.microbatches, activation_bytes=int(args.activation_mib * 2**20),
                         memory=args.memory, param_bytes_per_layer=int(args.param_mib_per_layer * 2**20),
                         clusters=args.clusters)
    _write(args.output, topology_to_json(topo))
    return 0


def cmd_eval(args) -> int:
    """The evaluation needs torch and the model: run it in a peer-side process, relay its result."""
    cmd = [sys.executable, "-m", "peer.evaluate", "--checkpoint", args.checkpoint, "--omit", str(args.omit)]
    for flag, value in (("--run", args.run), ("--data", args.data)):
        if value:
            cmd += [flag, value]
    if args.json:
        cmd.append("--json")
    try:
        return subprocess.run(cmd).returncode
    except KeyboardInterrupt:
        return 130


def register(subparsers) -> None:
    """Add the `plan`, `simulate` and `topology` subcommands to an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="plan one iteration's schedule from a topology file",
                              description="Partition nodes into stages, schedule every microbatch's path "
                                          "and each node's order; write the schedule JSON.")
    p.add_argument("--topology", required=True, help="topology JSON (skippipe-topology/1)")
    p.add_argument("--skip", type=skip_ratio, default=skip_ratio(DEFAULT_SKIP), metavar="K",
                   help=f"skip ratio k in [0, 1), e.g. 0.33 or 1/3; 0 is the full pipeline (default: {DEFAULT_SKIP})")
    p.add_argument("--strategy", choices=STRATEGIES, default="skippipe", help="planner or baseline")
    p.add_argument("--seed", type=int, default=0, help="RNG seed (same seed, same schedule)")
    p.add_argument("-o", "--output", help="schedule file to write (default: stdout)")
    p.add_argument("--run", default="default", help="run name stored in the schedule")
    p.add_argument("--epoch", type=int, default=0, help="schedule epoch")
    p.add_argument("--no-swaps", action="store_true", help="forbid stage reordering (rule 4 off)")
    p.add_argument("--no-collision-avoidance", action="store_true", help="the paper's non-collision-aware ablation")
    p.add_argument("--partitions", type=non_negative_int, default=0, metavar="N",
                   help="candidate node-to-stage partitions to plan and simulate; fewer plan faster, with "
                        "schedules that may be slower (default: 0 = auto, 48 up to 12 nodes, 576 / nodes beyond)")
    p.add_argument("--wire-compression", choices=WIRE_COMPRESSION, default="off",
                   help="links the schedule quantises (Schedule.wire; see `run --wire-compression`), priced "
                        "by the planner and `simulate` (default: off)")
    p.set_defaults(func=_guarded(cmd_plan))

    s = subparsers.add_parser("simulate", help="simulate one iteration of a schedule",
                              description="Event-simulate a schedule on its topology and check its constraints.")
    s.add_argument("schedule", help="schedule JSON written by `plan`")
    s.add_argument("--topology", required=True, help="topology JSON the schedule was planned for")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    s.add_argument("--gantt", metavar="FILE", help="write a Gantt chart (.svg or .png)")
    s.set_defaults(func=_guarded(cmd_simulate))

    t = subparsers.add_parser("topology", help="generate a synthetic heterogeneous topology",
                              description="geo: 12 world regions; clusters: fast clusters, slow links "
                                          "between; single: one cluster.")
    t.add_argument("--preset", choices=PRESETS, default="geo", help="network shape")
    t.add_argument("--nodes", type=positive_int, default=20, help="number of nodes")
    t.add_argument("--seed", type=int, default=0, help="RNG seed")
    t.add_argument("-o", "--output", help="file to write (default: stdout)")
    t.add_argument("--stages", type=positive_int, default=6, help="pipeline stages")
    t.add_argument("--layers", type=positive_int, default=24, help="model layers")
    t.add_argument("--microbatch-samples", type=positive_int, default=8, help="samples per microbatch")
    t.add_argument("--microbatches", type=positive_int, default=6, help="microbatches per data node per iteration")
    t.add_argument("--activation-mib", type=float, default=4.0, help="activation MiB per sample")
    t.add_argument("--memory", type=positive_int, default=3, help="activations a node can hold (microbatches)")
    t.add_argument("--param-mib-per-layer", type=float, default=0.0, help="for replica averaging; 0 = ignore")
    t.add_argument("--clusters", type=int, default=0, help="clusters preset: how many (0 = auto)")
    t.set_defaults(func=_guarded(cmd_topology))

    e = subparsers.add_parser("eval", help="held-out perplexity of a checkpoint with stages omitted",
                              description="Load a run's per-stage checkpoints and measure held-out perplexity "
                                          "with all stages and with a fraction F of the non-stage-0 stages "
                                          "omitted (random and worst-case choices). Runs python -m peer.evaluate.")
    e.add_argument("--checkpoint", required=True, metavar="DIR", help="the peers' checkpoint folder (<run>-stage<K>/it<N>/ per stage; the older <run>-stage<K>.pt files load too)")
    e.add_argument("--omit", type=_fraction_0_1, default="0.5", metavar="F",
                   help="fraction of the non-stage-0 stages to omit, in [0, 1] (default: 0.5)")
    e.add_argument("--run", help="which run, if the folder holds several")
    e.add_argument("--data", help="text file or folder (default: the embedded corpus)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_eval)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="SkipPipe offline planner tools")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
