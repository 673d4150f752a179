"""The peer's periodic one-line status."""
from peer.pipeline.worker import PipelineWorker


def status_line(worker: PipelineWorker, peer_id: str, state: str) -> str:
    stage = "-" if worker.stage is None else str(worker.stage)
    last = worker.history[-1] if worker.history else None
    parts = [f"peer {peer_id[:12]}", f"state={state}", f"stage={stage}", f"iteration={worker.iteration}",
             f"inbox={len(worker.inbox)}"]
    if worker.runner is not None:
        parts.append(f"stash={worker.runner.stashed}")
    if last is not None:
        took = last.finished_at - last.started_at
        parts.append(f"last_iter={took:.2f}s")
        if last.samples:
            parts.append(f"loss={last.loss_sum / last.samples:.3f}")
    return " ".join(parts)
