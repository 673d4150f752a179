"""Recovery rules for a microbatch whose next hop cannot take it: small pure functions.

In order of preference (architecture.md):
1. REROUTE: send it to another usable replica of the same stage;
2. SKIP: drop that stage from this microbatch's route when the skip budget allows;
3. REISSUE: ask the origin to send it again on a fresh route built from usable peers;
4. LOST: no usable route exists; the caller reports it (never silently).

Skip budget: SkipPipe trains a model to tolerate missing stages, so a run with k > 0 lets a
recovering microbatch visit `extra_skips` (default 1) stage fewer than planned; a run with
k = 0 has no such tolerance and never skips. A route never drops below two stages when the
model has more than one (stage 0 alone is not a model), keeps stage 0 first and only there,
visits each stage once and keeps SkipPipe's bounded jump between consecutive stages.
"""
import itertools
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from protocol.schedule import Hop, Route
from swarmcore.outcomes import Outcome
from swarmcore.path_rules import MAX_JUMP, jumps_ok  # noqa: F401 - the planner's jump rule, re-exported


class Action(Enum):
    REROUTE = Outcome.REROUTED.value
    SKIP = Outcome.SKIPPED_STAGE.value
    REISSUE = Outcome.REISSUED.value
    LOST = Outcome.LOST.value


@dataclass(frozen=True)
class Decision:
    action: Action
    route: Route | None               # the route to continue on (None for REISSUE / LOST)
    detail: str


@dataclass(frozen=True)
class Budget:
    min_visits: int                   # fewest stages a route may visit, stage 0 included
    max_jump: int = MAX_JUMP


def budget_for(planned: Route, num_stages: int, skip_ratio: float, extra_skips: int = 1) -> Budget:
    extra = extra_skips if skip_ratio > 0 else 0
    floor = 2 if num_stages > 1 else 1
    return Budget(min_visits=max(min(floor, len(planned.hops)), len(planned.hops) - extra))


def _pick(candidates: list[str], spread: int) -> str:
    """Deterministic but spread: different microbatches pick different replicas."""
    ordered = sorted(candidates)
    return ordered[spread % len(ordered)]


def recover_hop(route: Route, hop: int, replicas_of: Callable[[int], list[str]],
                usable: Callable[[str], bool], budget: Budget) -> Decision:
    """`route.hops[hop]` (hop >= 1) cannot take the microbatch: what now?"""
    if not 1 <= hop < len(route.hops):
        raise ValueError(f"hop {hop} is not a recoverable hop of a {len(route.hops)}-hop route")
    failed = route.hops[hop]
    others = [p for p in replicas_of(failed.stage) if p != failed.peer and usable(p)]
    if others:
        peer = _pick(others, route.microbatch_id)
        hops = route.hops[:hop] + (Hop(failed.stage, peer),) + route.hops[hop + 1:]
        return Decision(Action.REROUTE, Route(route.microbatch_id, hops),
                        f"stage {failed.stage}: {failed.peer[:12]} -> replica {peer[:12]}")
    hops = route.hops[:hop] + route.hops[hop + 1:]
    if len(hops) >= budget.min_visits and jumps_ok([h.stage for h in hops], budget.max_jump):
        return Decision(Action.SKIP, Route(route.microbatch_id, hops),
                        f"stage {failed.stage} skipped (no usable replica)")
    return Decision(Action.REISSUE, None, f"stage {failed.stage} has no usable replica and the "
                                          f"skip budget ({budget.min_visits} stages) is spent")


MAX_ROUTE_CANDIDATES = 5000              # bounds the search below on very long pipelines


def fresh_route(planned: Route, num_stages: int, replicas_of: Callable[[int], list[str]],
                usable: Callable[[str], bool], budget: Budget) -> Route | None:
    """A new route from the same origin that visits as many stages as planned where it can:
    the planned stages that still have a usable peer (in their planned order), topped up with
    other stages, lowest first; the longest such route within the jump bound (a greedy top-up
    alone can break the bound where another choice would not)."""
    mb, length = planned.microbatch_id, len(planned.hops)
    live = {s: [p for p in replicas_of(s) if usable(p)] for s in range(1, num_stages)}
    kept = [h.stage for h in planned.hops[1:] if live.get(h.stage)]
    spare = [s for s in range(1, num_stages) if live[s] and s not in kept]
    stages = _longest_valid(kept, spare, length - 1, budget)
    if stages is None:
        return None
    hops = (planned.hops[0],) + tuple(Hop(s, _pick(live[s], mb)) for s in stages)
    return Route(mb, hops)


def _longest_valid(kept: list[int], spare: list[int], want: int, budget: Budget) -> list[int] | None:
    tried = 0
    for n in range(min(want, len(kept) + len(spare)), budget.min_visits - 2, -1):
        for k in range(min(n, len(kept)), max(0, n - len(spare)) - 1, -1):   # keep as many planned as we can
            for keep in itertools.combinations(kept, k):
                for extra in itertools.combinations(spare, n - k):
                    tried += 1
                    if tried > MAX_ROUTE_CANDIDATES:
                        return None
                    stages = list(keep)
                    for s in extra:
                        pos = next((i for i, x in enumerate(stages) if x > s), len(stages))
                        stages.insert(pos, s)
                    if jumps_ok([0, *stages], budget.max_jump):
                        return stages
    return None


def check_route(route: Route, planned: Route, stage_of: dict[str, int], budget: Budget) -> str | None:
    """Why a recovered route a remote peer sent is not acceptable; None if it is."""
    if route.microbatch_id != planned.microbatch_id or route.hops[0] != planned.hops[0]:
        return "the route does not start at the microbatch's origin"
    stages = [h.stage for h in route.hops]
    if stages[0] != 0 or 0 in stages[1:]:
        return "stage 0 must come first and only once"
    if len(set(stages)) != len(stages):
        return "the route visits a stage twice"
    for h in route.hops:
        if stage_of.get(h.peer) != h.stage:
            return f"peer {h.peer[:12]} does not host stage {h.stage} in this schedule"
    if len(stages) < budget.min_visits:
        return f"the route visits {len(stages)} stages, fewer than the minimum {budget.min_visits}"
    if not jumps_ok(stages, budget.max_jump):
        return "the route jumps too far between stages"
    return None


def classify(planned: Route, final: Route, reissued: bool) -> Outcome:
    """How a microbatch ended, for exactly-once accounting (one category each)."""
    if reissued:
        return Outcome.REISSUED
    if len(final.hops) < len(planned.hops):
        return Outcome.SKIPPED_STAGE
    if final.hops != planned.hops:
        return Outcome.REROUTED
    return Outcome.COMPLETED
