"""Planner configuration and its one error type.

The SkipPipe rules (see shared/design/skippipe.md) map onto these switches:

1. a path starts and ends at its own stage-0 node, stage 0 never re-entered  -- structural,
   always on: the Route format encodes it (hops[0] is the origin, the return is implicit);
2. fixed path length ceil((1-k)*S - tol)                                       -- always on;
3. no stage twice in a path                                                   -- always on;
4. bounded reordering: `allow_swaps`, `max_swaps`, `max_swap_distance`, `max_total_swap_distance`;
5. bounded jump above the frontier: `max_jump` (0 = unbounded);
6. stage balance: `stage_balance` (+ `balance_slack`);
7. memory TC1: `memory_limit`;
8. collision avoidance TC2: `collision_avoidance` (False = the paper's non-collision-aware
   ablation: paths are chosen from link costs only and nodes keep no reservation table).
Rules 1-3 have no off switch because a schedule breaking them is not a SkipPipe schedule.
"""
from dataclasses import dataclass, field

from swarmcore.path_rules import MAX_JUMP, STRATEGIES  # noqa: F401 - STRATEGIES: the planner's names for them

from coordinator.planner.costs import Overheads
from protocol.quantised import WIRE_COMPRESSION


class PlanningError(ValueError):
    """The topology or configuration cannot be planned; the message names the problem."""


@dataclass(frozen=True)
class PlannerConfig:
    allow_swaps: bool = True             # rule 4: False = visited stages strictly increase
    max_swaps: int = 2                   # rule 4: visits below the frontier per path
    max_swap_distance: int = 1           # rule 4: frontier - stage for one swap
    max_total_swap_distance: int = 2     # rule 4: sum of swap distances in a path
    max_jump: int = MAX_JUMP             # rule 5: next stage - frontier (0 = unbounded)
    stage_balance: bool = True           # rule 6: every stage >= 1 gets ~equal microbatches
    balance_slack: int = 0               # rule 6: microbatches a stage may take above ceil(share)
    memory_limit: bool = True            # rule 7 (TC1): at most m held activations per node
    collision_avoidance: bool = True     # rule 8 (TC2): reservation tables, no overlaps
    data_nodes: int = 0                  # stage-0 (data) node count; 0 = auto (N / path length)
    beam_width: int = 6                  # partial paths kept per step of the path search
    candidates_per_stage: int = 5        # replicas of a stage tried per expansion
    restarts: int = 3                    # extra path-planning passes for each finalist partition
    partition_iters: int = 0             # annealing steps per partition; 0 = auto (partition.py)
    partitions: int = 0                  # candidate partitions, each planned once and simulated; 0 = auto
    finalists: int = 3                   # best candidates planned again with the restarts (SkipPipe)

    def __post_init__(self):
        for name in ("max_swaps", "max_swap_distance", "max_total_swap_distance", "max_jump",
                     "balance_slack", "data_nodes", "restarts", "partition_iters", "partitions",
                     "finalists"):
            if getattr(self, name) < 0:
                raise PlanningError(f"planner config {name} must be >= 0")
        if self.beam_width < 1 or self.candidates_per_stage < 1:
            raise PlanningError("planner config beam_width and candidates_per_stage must be >= 1")


@dataclass(frozen=True)
class PlanConfig:
    """What `plan()` needs besides the topology."""

    strategy: str = "skippipe"           # one of STRATEGIES
    skip_ratio: float = 1.0 / 3.0        # k in [0, 1)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    run: str = "default"
    epoch: int = 0
    overheads: Overheads = Overheads()   # the swarm's fixed costs (costs.py); zero: links + compute only
    wire_compression: str = "off"        # --wire-compression: which links the schedule quantises (costs.py)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise PlanningError(f"unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if not 0.0 <= self.skip_ratio < 1.0:
            raise PlanningError(f"skip ratio k={self.skip_ratio} is outside [0, 1)")
        if self.epoch < 0:
            raise PlanningError("epoch must be >= 0")
        if self.wire_compression not in WIRE_COMPRESSION:
            raise PlanningError(f"unknown wire compression {self.wire_compression!r}; "
                                f"expected one of {', '.join(WIRE_COMPRESSION)}")
