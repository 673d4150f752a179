"""The SkipPipe path rules both sides apply: the planner when it builds routes, a peer when it
repairs one mid-iteration (peer/routing/fallback.py). One source, so a repaired route never
breaks a rule the planner keeps. Pure: stdlib only."""

STRATEGIES = ("skippipe", "full", "random-skip")   # how the planner picks paths (--strategy)
MAX_JUMP = 4   # rule 5: a path's next stage lies at most this far above the highest visited so far


def jump_ok(frontier: int, stage: int, max_jump: int = MAX_JUMP) -> bool:
    """Whether `stage` may follow a path whose highest stage so far is `frontier` (rule 5;
    max_jump 0 = unbounded). Going back below the frontier is rule 4's business."""
    return not max_jump or stage - frontier <= max_jump


def jumps_ok(stages: list[int], max_jump: int = MAX_JUMP) -> bool:
    """Whether every step of a stage sequence keeps rule 5, relative to the frontier."""
    frontier = 0
    for s in stages[1:]:
        if not jump_ok(frontier, s, max_jump):
            return False
        frontier = max(frontier, s)
    return True
