"""`plan(topology, config, rng_or_seed) -> Schedule`: partition, paths, order, prediction."""
import dataclasses
import random

from coordinator.planner.baselines import full_paths, random_skip_paths
from coordinator.planner.config import PlanConfig, PlanningError
from coordinator.planner.costs import CostModel
from coordinator.planner.partition import (auto_partition_iters, auto_partitions, data_node_count, partition,
                                           partition_score)
from coordinator.planner.paths import PathPlanner
from coordinator.planner.rules import path_length
from coordinator.planner.steady import predict
from protocol.schedule import Hop, OrderEntry, PeerOrder, Phase, Route, Schedule, StageAssignment
from protocol.topology import Topology


def _rng(rng_or_seed) -> tuple[random.Random, int]:
    if isinstance(rng_or_seed, random.Random):
        return rng_or_seed, 0
    if hasattr(rng_or_seed, "integers"):              # numpy Generator
        return random.Random(int(rng_or_seed.integers(2**62))), 0
    if isinstance(rng_or_seed, int) and rng_or_seed >= 0:
        return random.Random(rng_or_seed), rng_or_seed
    raise PlanningError(f"seed must be a non-negative int, random.Random or numpy Generator, got {rng_or_seed!r}")


def _check(topology: Topology, cost: CostModel) -> None:
    w = topology.workload
    if len(w.layers_per_stage()) != w.num_stages or sum(w.layers_per_stage()) != w.num_layers:
        raise PlanningError(f"stage_sizes {w.stage_sizes} do not split {w.num_layers} layers into {w.num_stages} stages")
    if len(topology.nodes) < w.num_stages:
        raise PlanningError(f"topology has {len(topology.nodes)} nodes but {w.num_stages} stages need at least "
                            f"{w.num_stages} (one node per stage)")
    bad = [n.id for n, m in zip(topology.nodes, cost.memory) if m < 1]
    if bad:
        raise PlanningError(f"memory_microbatches < 1 on {', '.join(bad)}: no microbatch could ever run there")


def split_batch(cost: CostModel, origins: list[int], global_batch: int) -> list[int]:
    """Microbatches per origin: `global_batch` in proportion to each origin's speed (the inverse
    of its stage-0 forward + backward time), largest remainders first; every origin gets at
    least one while the batch has enough."""
    speed = [1.0 / (cost.fwd_list[o][0] + cost.bwd_list[o][0]) for o in origins]
    floor = 1 if global_batch >= len(origins) else 0
    rest = global_batch - floor * len(origins)
    shares = [rest * v / sum(speed) for v in speed]
    counts = [floor + int(x) for x in shares]
    by_remainder = sorted(range(len(origins)), key=lambda k: (-(shares[k] - int(shares[k])), k))
    for k in by_remainder[:global_batch - sum(counts)]:
        counts[k] += 1
    return counts


def _microbatches(stage_of: list[int], m: int, rng: random.Random | None,
                  counts: list[int] | None = None) -> list[tuple[int, int]]:
    """(id, origin) in planning order: round j takes microbatch j of every origin that has one.
    `counts`: microbatches per origin (default: m each); ids run origin by origin."""
    origins = [n for n, s in enumerate(stage_of) if s == 0]
    counts = counts if counts is not None else [m] * len(origins)
    first = [sum(counts[:k]) for k in range(len(origins))]
    out = []
    for j in range(max(counts, default=0)):
        order = [k for k in range(len(origins)) if j < counts[k]]
        if rng is not None:
            rng.shuffle(order)
        out += [(first[k] + j, origins[k]) for k in order]
    return out


def _origin_counts(topology: Topology, cost: CostModel, stage_of: list[int]) -> list[int] | None:
    """The global batch's split among this partition's data nodes, or None (the per-node count)."""
    g = topology.workload.global_batch
    return split_batch(cost, [n for n, s in enumerate(stage_of) if s == 0], g) if g else None


def _schedule(topology, config, cost, stage_of, paths, node_tasks, skip_ratio, seed) -> Schedule:
    ids = topology.node_ids
    routes = tuple(Route(mb, tuple(Hop(st, ids[n]) for st, n in zip(stages, nodes)))
                   for mb, stages, nodes in sorted(paths))
    order = tuple(PeerOrder(ids[n], tuple(OrderEntry(mb, ph) for *_, mb, ph in sorted(tasks)))
                  for n, tasks in sorted(node_tasks.items()) if tasks)
    schedule = Schedule(config.run, config.epoch, config.strategy, topology.workload.num_stages, skip_ratio,
                        tuple(StageAssignment(ids[n], st) for n, st in enumerate(stage_of)), routes, order,
                        0.0, seed)
    return dataclasses.replace(schedule, wire=cost.wire_of(schedule))   # the links it quantises


def _with_prediction(schedule: Schedule, topology: Topology, cost: CostModel) -> tuple[Schedule, float, int]:
    """The schedule with its predicted time, that time, and the memory overflows it simulates."""
    p = predict(schedule, topology, cost)
    return dataclasses.replace(schedule, predicted_iteration_s=p.iteration_s), p.iteration_s, p.memory_overflows


def _skippipe(topology, config, cost, stage_of, length, rng, seed, restarts: int) -> Schedule:
    cfg, m = config.planner, topology.workload.microbatches_per_data_node
    best, best_key = None, (True, float("inf"))       # (overflows memory, predicted s)
    for attempt in range(restarts + 1):
        mbs = _microbatches(stage_of, m, rng if attempt else None, _origin_counts(topology, cost, stage_of))
        planner = PathPlanner(cost, stage_of, length, cfg, len(mbs))
        paths, node_tasks = [], {}
        for mb, origin in mbs:
            p = planner.plan_one(mb, origin)
            paths.append((mb, p.stages, p.nodes))
            for n, kind, start, end in p.tasks:    # the head is the origin's second FORWARD
                phase = Phase.BACKWARD if kind == "B" else Phase.FORWARD
                node_tasks.setdefault(n, []).append((start, end, mb, phase))
        variants = [node_tasks] if cfg.collision_avoidance else []
        for tasks in variants + [{}]:               # the planned order, and plain FIFO
            sched, t, overflows = _with_prediction(_schedule(topology, config, cost, stage_of, paths, tasks,
                                                             config.skip_ratio, seed), topology, cost)
            # FIFO can be faster on paper by holding more activations than a node has room for
            over = cfg.memory_limit and overflows > 0
            if (over, t) < (best_key[0], best_key[1] - 1e-9):
                best, best_key = sched, (over, t)
    return best


def plan(topology: Topology, config: PlanConfig | None = None, rng_or_seed=0) -> Schedule:
    """Plan one iteration for `topology`; deterministic for an int seed. Raises PlanningError."""
    config = config or PlanConfig()
    rng, seed = _rng(rng_or_seed)
    cost = CostModel(topology, config.overheads, config.wire_compression)   # links priced as they will travel
    _check(topology, cost)
    w, cfg = topology.workload, config.planner
    length = path_length(w.num_stages, config.skip_ratio)
    pinned0 = sum(1 for n in topology.nodes if n.stage == 0)
    d = data_node_count(len(topology.nodes), w.num_stages, length, pinned0, cfg.data_nodes)
    # Every strategy gets the same search: many short annealing runs, each partition planned
    # and simulated; the best schedule wins (a baseline searched less would flatter SkipPipe).
    # Many short runs beat a few long ones: the annealing score is only a rough guide to the
    # simulated time, so what pays is simulating many different partitions.
    count = cfg.partitions or auto_partitions(len(topology.nodes))
    iters = cfg.partition_iters or auto_partition_iters(len(topology.nodes), count)
    skippipe = config.strategy == "skippipe"
    part_length, pipelines = (length if skippipe else w.num_stages), config.strategy == "full"
    scorer = partition_score(cost, part_length, d, pipelines)     # shared: it remembers what it scored
    parts = [partition(cost, part_length, d, iters, rng, pipelines=pipelines, score=scorer) for _ in range(count)]
    if not skippipe:
        return min((_baseline(topology, config, cost, so, length, rng, seed) for so in parts),
                   key=lambda sc: sc.predicted_iteration_s)
    # one path-planning pass ranks the partitions; only the best few get the restarts
    quick = _once_per_partition(parts, lambda so: _skippipe(topology, config, cost, so, length, rng, seed, 0))
    ranked = sorted(range(len(parts)), key=lambda i: quick[i].predicted_iteration_s)[:max(1, cfg.finalists)]
    finals = [quick[i] if cfg.restarts == 0 else _skippipe(topology, config, cost, parts[i], length, rng, seed,
                                                           cfg.restarts) for i in ranked]
    return min(finals, key=lambda sc: sc.predicted_iteration_s)


def _once_per_partition(parts: list[list[int]], plan_one) -> list[Schedule]:
    """plan_one(partition) for each of `parts`, called once per distinct partition (a pass
    without restarts is deterministic): on a small swarm the annealing runs mostly end in the
    same few (6 nodes: 20 distinct of 48). The copies stay in the list, so the ranking and the
    finalists' restarts are what they would be."""
    keys = [tuple(so) for so in parts]
    planned: dict[tuple[int, ...], Schedule] = {}
    for key, so in zip(keys, parts):
        if key not in planned:
            planned[key] = plan_one(so)
    return [planned[key] for key in keys]


def _baseline(topology, config, cost, stage_of, length, rng, seed) -> Schedule:
    """`full` (DT-FM pipelines on its own partition) or `random-skip`."""
    mbs = _microbatches(stage_of, topology.workload.microbatches_per_data_node, None,
                        _origin_counts(topology, cost, stage_of))
    if config.strategy == "full":
        paths, k = full_paths(cost, stage_of, mbs), 0.0
    else:
        paths, k = random_skip_paths(cost, stage_of, length, config.planner, mbs, rng), config.skip_ratio
    sched = _schedule(topology, config, cost, stage_of, paths, {}, k, seed)
    return _with_prediction(sched, topology, cost)[0]
