"""The path rules of SkipPipe as small pure functions shared by the planner, the baselines
and the validator, so all three agree on what a legal stage sequence is."""
import math
from dataclasses import dataclass

from coordinator.planner.config import PlannerConfig, PlanningError


def path_length(num_stages: int, skip_ratio: float) -> int:
    """Stages a microbatch visits, stage 0 included: ceil((1-k) * S).

    Rounded to 9 decimals first so that k = 1/3 with S = 6 gives 4, not 5."""
    if not 0.0 <= skip_ratio < 1.0:
        raise PlanningError(f"skip ratio k={skip_ratio} is outside [0, 1)")
    return max(1, min(num_stages, math.ceil(round((1.0 - skip_ratio) * num_stages, 9))))


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
        if cfg.max_jump and stage - state.frontier > cfg.max_jump:
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
