"""The peer's periodic one-line status, and the same facts as a dict for /api/status."""
from peer.pipeline.worker import PipelineWorker
from swarmcore.outcomes import OUTCOMES


def status_line(worker: PipelineWorker, peer_id: str, state: str, reach: str = "") -> str:
    stage = "-" if worker.seat.stage is None else str(worker.seat.stage)
    last = worker.ledger.history[-1] if worker.ledger.history else None
    parts = [f"peer {peer_id[:12]}", f"state={state}", f"stage={stage}"]
    if worker.seat.stage is None:
        parts.append(f"waiting: {waiting_reason(worker)}")
    parts += [f"iteration={worker.ledger.iteration}", f"inbox={len(worker.inbox)}"]
    if worker.seat.runner is not None:
        parts.append(f"stash={worker.seat.runner.stashed}")
    if last is not None:
        took = last.finished_at - last.started_at
        parts.append(f"last_iter={took:.2f}s")
        if last.samples:
            parts.append(f"loss={last.loss_sum / last.samples:.3f}")
    if reach:
        parts.append(f"reach={reach}")
    if worker.isolation.cut_off:
        parts.append("CUT-OFF")
    return " ".join(parts)


def waiting_reason(worker: PipelineWorker) -> str:
    """Why a peer has no stage yet, in the words its status line shows."""
    latest = worker.book.latest
    if latest is None:
        return "no schedule yet"
    if worker.me not in latest.stage_of():
        return f"not in schedule epoch {latest.epoch} yet (the coordinator re-plans when it sees this peer)"
    return "building the stage"


def status_dict(app) -> dict:
    """What /api/status on the peer shows; works at any point of start-up."""
    worker = getattr(app, "worker", None)
    reach = app.reachability.as_dict() if app.reachability is not None else None
    if reach is not None:
        reach["inbound_peers"] = len(app.metrics.inbound_peers)
    out = {"state": app.advert_state.name, "run": app.config.run, "device": app.config.device,
           "reachability": reach}
    if worker is not None:
        last = worker.ledger.history[-1] if worker.ledger.history else None
        out.update(peer_id=worker.me, stage=worker.seat.stage, iteration=worker.ledger.iteration,
                   inbox=len(worker.inbox),
                   waiting=waiting_reason(worker) if worker.seat.stage is None else None,
                   cut_off=worker.isolation.cut_off,
                   last_iteration_s=(last.finished_at - last.started_at) if last else None,
                   last_loss=(last.loss_sum / last.samples) if last and last.samples else None,
                   microbatches={k: sum(o.counts.get(k, 0) for o in worker.ledger.history) for k in OUTCOMES})
    return out
