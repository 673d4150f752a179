"""Typed constraint violations of a schedule against its topology and the SkipPipe rules."""
import math
from dataclasses import dataclass
from enum import Enum

from coordinator.planner.config import PlannerConfig
from coordinator.planner.rules import path_length, sequence_problems
from protocol.schedule import Phase, Schedule
from protocol.topology import Topology


class ViolationKind(str, Enum):
    UNKNOWN_NODE = "unknown_node"            # a hop, assignment or order names no topology node
    WRONG_STAGE = "wrong_stage"              # the hop's node hosts another stage
    BAD_ORIGIN = "bad_origin"                # route does not start at stage 0 on a stage-0 node
    STAGE_ZERO_REENTERED = "stage_zero_reentered"
    STAGE_REPEATED = "stage_repeated"
    PATH_LENGTH = "path_length"
    SWAP = "swap"                            # rule 4
    JUMP = "jump"                            # rule 5
    STAGE_IMBALANCE = "stage_imbalance"      # rule 6: above the load cap or uneven
    MEMORY = "memory"                        # rule 7: the node's order exceeds its memory
    EMPTY_STAGE = "empty_stage"              # a stage has no node
    DUPLICATE_MICROBATCH = "duplicate_microbatch"


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    message: str
    microbatch_id: int = -1
    peer: str = ""

    def to_plain(self) -> dict:
        return {"kind": self.kind.value, "message": self.message,
                "microbatch_id": self.microbatch_id, "peer": self.peer}


def _route_violations(schedule: Schedule, topology: Topology, cfg: PlannerConfig) -> list[Violation]:
    out, ids = [], set(topology.node_ids)
    stage_of = schedule.stage_of()
    length = path_length(schedule.num_stages, schedule.skip_ratio)
    seen = set()
    for r in schedule.routes:
        mb, V = r.microbatch_id, ViolationKind
        if mb in seen:
            out.append(Violation(V.DUPLICATE_MICROBATCH, f"microbatch {mb} has two routes", mb))
        seen.add(mb)
        for i, h in enumerate(r.hops):
            if h.peer not in ids:
                out.append(Violation(V.UNKNOWN_NODE, f"microbatch {mb} hop {i}: unknown node {h.peer!r}", mb, h.peer))
            elif stage_of.get(h.peer) != h.stage:
                out.append(Violation(V.WRONG_STAGE, f"microbatch {mb} hop {i}: {h.peer} hosts stage "
                                     f"{stage_of.get(h.peer)}, not {h.stage}", mb, h.peer))
        if r.hops[0].stage != 0 or stage_of.get(r.origin) != 0:
            out.append(Violation(V.BAD_ORIGIN, f"microbatch {mb} does not start on a stage-0 node", mb, r.origin))
        if 0 in r.stages[1:]:
            out.append(Violation(V.STAGE_ZERO_REENTERED, f"microbatch {mb} re-enters stage 0", mb))
        if len(set(r.stages)) != len(r.stages):
            out.append(Violation(V.STAGE_REPEATED, f"microbatch {mb} visits a stage twice: {r.stages}", mb))
        if len(r.hops) != length:
            out.append(Violation(V.PATH_LENGTH, f"microbatch {mb} visits {len(r.hops)} stages, "
                                 f"expected {length}", mb))
        for hop, problem in sequence_problems(r.stages, cfg):
            kind = V.JUMP if problem.startswith("jump") else V.SWAP
            out.append(Violation(kind, f"microbatch {mb} hop {hop}: {problem}", mb))
    return out


def _balance_violations(schedule: Schedule, cfg: PlannerConfig) -> list[Violation]:
    s = schedule.num_stages
    if not cfg.stage_balance or s < 2 or not schedule.routes:
        return []
    counts = [0] * s
    for r in schedule.routes:
        for st in set(r.stages):
            if 0 < st < s:
                counts[st] += 1
    length = path_length(s, schedule.skip_ratio)
    cap = math.ceil(len(schedule.routes) * (length - 1) / (s - 1) - 1e-9) + cfg.balance_slack
    out = [Violation(ViolationKind.STAGE_IMBALANCE, f"stage {st} gets {c} microbatches, above the cap {cap}")
           for st, c in enumerate(counts) if st > 0 and c > cap]
    if max(counts[1:]) - min(counts[1:]) > 1 + cfg.balance_slack:
        out.append(Violation(ViolationKind.STAGE_IMBALANCE,
                             f"stages get uneven microbatch counts {counts[1:]} (stages 1..{s - 1})"))
    return out


def _memory_violations(schedule: Schedule, topology: Topology) -> list[Violation]:
    """Played in its order, a node holds forwards - backwards so far, which must stay <= m (peers
    may run later-listed tasks early, but never a forward whose slot the order counts on)."""
    nodes = {n.id: n for n in topology.nodes}
    out = []
    for po in schedule.order:
        node = nodes.get(po.peer)
        if node is None:
            out.append(Violation(ViolationKind.UNKNOWN_NODE, f"order for unknown node {po.peer!r}", peer=po.peer))
            continue
        held, m, started = 0, node.memory(topology.workload), set()
        for e in po.tasks:
            if e.phase == Phase.FORWARD and e.microbatch_id in started:
                continue                      # the origin's second FORWARD is the head: no new activation
            if e.phase == Phase.FORWARD:
                started.add(e.microbatch_id)
                if held >= m:
                    out.append(Violation(ViolationKind.MEMORY, f"{po.peer} starts microbatch "
                                         f"{e.microbatch_id} while holding {held} >= {m}", e.microbatch_id, po.peer))
                held += 1
            else:
                held -= 1
    return out


def validate(schedule: Schedule, topology: Topology, cfg: PlannerConfig | None = None) -> list[Violation]:
    """Every violation found (empty list = valid)."""
    cfg = cfg or PlannerConfig()
    ids = set(topology.node_ids)
    out = [Violation(ViolationKind.UNKNOWN_NODE, f"assignment names unknown node {a.peer!r}", peer=a.peer)
           for a in schedule.assignment if a.peer not in ids]
    hosted = {a.stage for a in schedule.assignment}
    out += [Violation(ViolationKind.EMPTY_STAGE, f"stage {st} has no node")
            for st in range(schedule.num_stages) if st not in hosted]
    out += _route_violations(schedule, topology, cfg)
    out += _balance_violations(schedule, cfg)
    out += _memory_violations(schedule, topology)
    return out
