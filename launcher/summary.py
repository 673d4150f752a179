"""What skippipe-swarm prints while the run goes, and the summary it prints and writes at the end."""
import collections
from pathlib import Path

from coordinator.iteration_summaries import IterationSummary
from swarmcore.outcomes import OUTCOMES
from tokendata.cursor import expand_positions


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
        "microbatches": {k: sum(getattr(s, k) for s in summaries) for k in OUTCOMES},
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
    """Bans and spot checks, the peers demoted by measured speed when the run ended (a
    demotion near the end may have had no re-plan to show up in `replans`), and the witnessed
    ratios to the median that the origins' round trips gave each peer (coordinator/witnessed_speed.py)."""
    return {"banned": dict(app.bans.banned), "spot_checks": dict(app.bans.counts),
            "slow_peers": {p: round(r, 2) for p, r in app.slow_peers.factors.items()},
            "witnessed": {p: round(r, 2) for p, (r, _) in app.slow_peers.witnessed.items()}}


def main_epoch(summaries: list[IterationSummary]) -> int | None:
    """The epoch most iterations ran under (the later one on a tie). Its schedule is the one
    to compare with what was measured: peers leaving at the end of a run trigger re-plans
    whose schedules never ran."""
    counts = collections.Counter(s.epoch for s in summaries)
    return max(counts, key=lambda e: (counts[e], e)) if counts else None


def ran_schedule(app, summaries: list[IterationSummary]):
    epoch = main_epoch(summaries)
    return next((s for s in app.published.all if s.epoch == epoch), app.schedule)


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
