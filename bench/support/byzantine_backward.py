"""The backward-gradient attack of bench/byzantine.py (issue 24): one replica of stage 1 returns
its input gradients multiplied by -100 (`--fault badgrad@0:-100`) while its forwards, its own
parameter gradients and its spot-check answers stay honest, so only backward spot checks can see
it. The real worker, handlers and spot checks over the in-memory transport; the coordinator's
part is played here: its BanList (reports count only from the receivers of the checked backward
on the published routes) reads every published report, and on a ban a schedule without the
cheater starts two iterations later, as the coordinator's re-plan would."""
import asyncio
import collections
import dataclasses
import math

from coordinator.swarm_view import BanList
from peer.chaos import corrupting, parse_faults
from peer.evaluate import perplexity
from peer.pipeline.backward_checks import GradientBound
from peer.security.spot_check_rules import SpotSampler

from bench.support.memory_swarm import build_memory_swarm, make_schedule

CHEATER = "c1"
FACTOR = -100.0
START = 0                       # the first iteration it cheats in
RATE = 0.5                      # share of the forwards (and so backwards) another replica recomputes


def replan_without(stage_of: dict[str, int], origins: list[str], microbatches: int, banned: str,
                   start_iteration: int, epoch: int):
    left = {p: s for p, s in stage_of.items() if p != banned}
    middle = sorted(p for p, s in left.items() if s == 1)
    paths = {mb: [origins[mb % len(origins)], middle[mb % len(middle)]] for mb in range(microbatches)}
    return dataclasses.replace(make_schedule("byz", left, paths, epoch=epoch), start_iteration=start_iteration)


def train_with_backward_cheater(spec, data, held_out, stage_of: dict[str, int], paths: dict[int, list[str]],
                                checks: bool = True, bound: bool = True) -> dict:
    """Train with CHEATER scaling its returned gradients; `checks`: spot checks at RATE (else
    none); `bound`: the receivers' size bound on returned gradients (both off: the attack
    unopposed). Returns the honest replicas' held-out loss and the ban."""
    first = make_schedule("byz", stage_of, paths)
    routes = {(first.epoch, r.microbatch_id): r for r in first.routes}
    bans = BanList(routes=lambda epoch, mb: routes.get((epoch, mb)))
    origins = sorted(p for p, s in stage_of.items() if s == 0)
    found: dict = {}

    async def go():
        _, workers = await build_memory_swarm(spec, first, data, 600.0, None, "float16")
        seat = workers[CHEATER].seat
        seat.make_runner = corrupting(seat.make_runner, parse_faults(f"badgrad@{START}:{FACTOR}"))
        for peer, w in workers.items():
            w.spot.sampler = SpotSampler(RATE if checks else 0.0)
            if not bound:
                w.spot.bound = GradientBound(factor=math.inf)

            async def publish(record, peer=peer):
                found.setdefault("failed", set()).update((r.checker, r.iteration, r.microbatch_id) for r in record.reports
                                                         if r.kind == "backward" and not r.passed)
                if bans.observe(peer, record.reports) and "iteration" not in found:
                    at = max(x.ledger.iteration for x in workers.values()) + 2
                    found["iteration"] = at
                    nxt = replan_without(stage_of, origins, len(paths), CHEATER, at, first.epoch + 1)
                    for x in workers.values():
                        x.book.add(nxt)
            w.spot.publish = publish
        cheater = asyncio.ensure_future(workers[CHEATER].run())
        try:
            await asyncio.wait_for(asyncio.gather(*(w.run() for p, w in workers.items() if p != CHEATER)), 1200)
        finally:
            cheater.cancel()     # planned out (or done): it waits for a schedule with it in it
            await asyncio.gather(cheater, return_exceptions=True)
        return workers

    workers = asyncio.run(go())
    stages = [workers[origins[0]].seat.runner.module.eval(), workers["a1"].seat.runner.module.eval()]
    failed_honest = {r.suspect for w in workers.values() for r in w.spot.reports if not r.passed} - {CHEATER}
    left_out = collections.Counter()
    for w in workers.values():
        left_out.update(w.spot.bound.left_out)
    return {"loss": math.log(perplexity(stages, (0, 1), held_out)), "banned": sorted(bans.banned),
            "cheater_left_out": left_out.pop(CHEATER, 0), "honest_left_out": sum(left_out.values()),
            "judged": sum(w.spot.bound.judged for w in workers.values()),
            "ban_iteration": found.get("iteration"), "honest_reported": sorted(failed_honest),
            "backward_failed": len(found.get("failed", ()))}
