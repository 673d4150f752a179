"""The path rules of SkipPipe as small pure functions shared by the planner, the baselines
and the validator, so all three agree on what a legal stage sequence is."""
import math
from dataclasses import dataclass

from swarmcore.path_rules import jump_ok

from coordinator.planner.config import PlannerConfig, PlanningError


PATH_TOLERANCE = 0.01   # of S (at most half a stage): how far (1-k)*S may lie above a whole number and mean it


def path_length(num_stages: int, skip_ratio: float) -> int:
    """Stages a microbatch visits, stage 0 included: ceil((1-k)*S - min(0.01*S, 0.5)), in [1, S].

    The paper's ceil((1-k)*S), made robust to how k is written: with S = 6, k = 1/3, 0.3333
    and 0.33 all give 4 (0.33 gives 4.02, which plain ceil would turn into 5); k = 0.3 still
    gives 5 (4.2). A k within 1% of S (at most half a stage) of a whole number of skipped
    stages means that number; k = 0 is always the full pipeline."""
    if not 0.0 <= skip_ratio < 1.0:
        raise PlanningError(f"skip ratio k={skip_ratio} is outside [0, 1)")
    slack = min(PATH_TOLERANCE * num_stages, 0.5)
    return max(1, min(num_stages, math.ceil(round((1.0 - skip_ratio) * num_stages - slack, 9))))


def describe_path(num_stages: int, skip_ratio: float) -> str:
    """What every command prints about k: the path length it uses."""
    length = path_length(num_stages, skip_ratio)
    return f"each microbatch visits {length} of {num_stages} stages (path length {length})"


@dataclass(frozen=True)
class SeqState:
    """Where a partial stage sequence stands with respect to rules 4 and 5."""

    frontier: int = 0
    swaps: int = 0
    swap_distance: int = 0


def step(state: SeqState, stage: int, visited, cfg: PlannerConfig) -> SeqState | None:
    """The state after visiting `stage` next, or None if a rule forbids it (rules 1, 3, 4, 5)."""
    if stage <= 0 or stage in visited:
        return None
    if stage > state.frontier:
        if not jump_ok(state.frontier, stage, cfg.max_jump):
            return None
        return SeqState(stage, state.swaps, state.swap_distance)
    dist = state.frontier - stage
    if (not cfg.allow_swaps or dist > cfg.max_swap_distance or state.swaps + 1 > cfg.max_swaps
            or state.swap_distance + dist > cfg.max_total_swap_distance):
        return None
    return SeqState(state.frontier, state.swaps + 1, state.swap_distance + dist)


def can_finish(state: SeqState, visited, remaining: int, num_stages: int, cfg: PlannerConfig,
               allowed=None) -> bool:
    """Cheap necessary condition: enough unvisited (and `allowed`) stages above the frontier,
    or swappable below it."""
    def free(s):
        return s not in visited and (allowed is None or s in allowed)
    above = sum(1 for s in range(state.frontier + 1, num_stages) if free(s))
    below = 0
    if cfg.allow_swaps and state.swaps < cfg.max_swaps:
        lo = max(1, state.frontier - cfg.max_swap_distance)
        below = sum(1 for s in range(lo, state.frontier) if free(s))
    return above + min(below, cfg.max_swaps - state.swaps) >= remaining


def sequence_problems(stages: tuple[int, ...], cfg: PlannerConfig) -> list[tuple[int, str]]:
    """(hop index, problem) for each rule-4/5 violation of a stage sequence starting at 0."""
    problems = []
    state, visited = SeqState(), {0}
    for i, s in enumerate(stages[1:], start=1):
        if s in visited or s <= 0:
            visited.add(s)
            continue  # repeats and stage 0 are reported by the caller
        nxt = step(state, s, visited, cfg)
        if nxt is None:
            kind = "jump" if s > state.frontier else "swap"
            problems.append((i, f"{kind} to stage {s} from frontier {state.frontier} breaks the "
                                f"{'max_jump' if kind == 'jump' else 'swap'} rule"))
            nxt = SeqState(max(state.frontier, s), state.swaps, state.swap_distance)
        state = nxt
        visited.add(s)
    return problems
