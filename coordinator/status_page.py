"""The coordinator's status page (/), its JSON (/api/status) and Prometheus metrics (/metrics):
read-only views of a CoordinatorApp. The page itself is coordinator/status_page.html, a
self-contained HTML/JS/SVG file that polls /api/status (no CDN: it works offline)."""
import collections
import ipaddress
import json
import math
import time
from pathlib import Path

from opsweb.prom import CONTENT_TYPE, Exposition, process_rss_bytes
from opsweb.server import Response
from protocol.adverts import PeerState

from coordinator.planner.simulate import simulate
from coordinator.swarm_view import SwarmSnapshot
from swarmcore.outcomes import OUTCOMES

PAGE = Path(__file__).with_name("status_page.html")
ITERATIONS_SHOWN = 500
PLANNED_TASKS_SHOWN = 4000
COUNT_KINDS = OUTCOMES


def reachability(peer: str, snapshot: SwarmSnapshot) -> dict:
    """What the coordinator can tell about a peer's reachability: its advertised addresses
    (relayed? any public?) and how many other peers measured a link to it (so dialed it)."""
    maddrs = snapshot.adverts[peer].maddrs if peer in snapshot.adverts else ()
    relayed = any("/p2p-circuit" in m for m in maddrs)
    public = any(not _private(m) for m in maddrs if "/p2p-circuit" not in m)
    dialed_by = sum(1 for reporter, report in snapshot.links.items()
                    if reporter != peer and any(m.peer_id == peer for m in report.links))
    verdict = "relayed" if relayed else ("direct" if dialed_by else "unverified")
    self_test = snapshot.adverts[peer].reachability if peer in snapshot.adverts else ""
    return {"verdict": verdict, "relayed": relayed, "public": public, "dialed_by": dialed_by,
            "self_test": self_test or None}


def _private(maddr: str) -> bool:
    parts = maddr.strip("/").split("/")
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6"):
        return parts[:2] == ["dns4", "localhost"]
    try:
        return not ipaddress.ip_address(parts[1]).is_global
    except ValueError:
        return True


def json_safe(value):
    """NaN and infinities become null: browsers' JSON.parse rejects them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class StatusView:
    def __init__(self, app):
        self.app = app
        self.events: collections.deque[dict] = collections.deque(maxlen=100)  # joins, departures, bans
        self._online: set[str] | None = None
        self._banned: set[str] = set()
        self._planned: tuple[int, dict] | None = None   # (epoch, gantt rows) cache: simulate once per epoch
        self.started_at = time.time()

    def observe(self, snapshot: SwarmSnapshot) -> None:
        """Called by the app once per round: turns membership changes into events."""
        now = time.time()
        online = set(snapshot.online)
        if self._online is not None:
            for p in sorted(self._online - online):
                self.events.append({"at": now, "kind": "departed", "peer": p,
                                    "text": f"peer {p[:12]} went offline or stopped announcing"})
            for p in sorted(online - self._online):
                self.events.append({"at": now, "kind": "joined", "peer": p, "text": f"peer {p[:12]} joined"})
        for p in sorted(set(self.app.bans.banned) - self._banned):
            self.events.append({"at": now, "kind": "banned", "peer": p, "text": self.app.bans.banned[p]})
        self._online, self._banned = online, set(self.app.bans.banned)

    # -- the JSON ---------------------------------------------------------------------------
    def status(self) -> dict:
        app, now = self.app, time.time()
        snapshot = getattr(app, "snapshot", None) or SwarmSnapshot({}, {})
        schedule = app.schedule
        return {
            "run": app.config.run, "now": now, "uptime_s": now - self.started_at,
            "spec": {"model": app.spec.model, "stages": app.spec.num_stages, "skip_ratio": app.spec.skip_ratio,
                     "strategy": app.config.strategy, "max_steps": app.spec.max_steps},
            "coordinator": {"maddrs": app.maddrs if app.dht is not None else [], "finished": app.finished},
            "schedule": None if schedule is None else {
                "epoch": schedule.epoch, "start_iteration": schedule.start_iteration, "routes": len(schedule.routes),
                "predicted_iteration_s": schedule.predicted_iteration_s, "strategy": schedule.strategy},
            "peers": self._peers(snapshot, now),
            "stages": self._stages(snapshot),
            "gantt": self._gantt(),
            "iterations": [self._row(s) for s in app.summaries[-ITERATIONS_SHOWN:]],
            "replans": list(app.replans[-50:]),
            "faults": self._faults(),
            "spot_checks": dict(app.bans.counts),
        }

    def _peers(self, snapshot: SwarmSnapshot, now: float) -> list[dict]:
        stage_of = self.app.schedule.stage_of() if self.app.schedule else {}
        measured = {p: r.tokens / max(r.finished_at - r.started_at, 1e-9)
                    for p, r in getattr(self.app, "last_reports", {}).items()}
        rows = []
        for pid, a in sorted(snapshot.adverts.items()):
            layers = max(1, a.layer_end - a.layer_start) if a.layer_end else max(
                1, a.num_layers // max(1, self.app.spec.num_stages))
            rows.append({
                "peer_id": pid, "name": a.public_name, "state": PeerState(a.state).name, "device": a.device,
                "stage": stage_of.get(pid, a.stage if a.stage >= 0 else None),
                "layers": [a.layer_start, a.layer_end],
                "forward_samples_per_s": 1.0 / (a.fwd_s_per_layer_sample * layers) if a.fwd_s_per_layer_sample else None,
                "tokens_per_s": measured.get(pid), "memory_free_bytes": a.memory_free_bytes,
                "last_seen_s": max(0.0, now - a.timestamp) if a.timestamp else None,
                "reachability": reachability(pid, snapshot), "banned": None, "version": a.package_version})
        for pid, reason in sorted(self.app.bans.banned.items()):
            rows.append({"peer_id": pid, "name": "", "state": "BANNED", "device": "", "stage": None, "layers": [0, 0],
                         "forward_samples_per_s": None, "tokens_per_s": None, "memory_free_bytes": 0,
                         "last_seen_s": None, "reachability": None, "banned": reason, "version": ""})
        return rows

    def _stages(self, snapshot: SwarmSnapshot) -> list[dict]:
        schedule = self.app.schedule
        if schedule is None:
            return []
        stages: dict[int, list[str]] = {}
        for peer, stage in schedule.stage_of().items():
            stages.setdefault(stage, []).append(peer)
        return [{"stage": s, "replicas": sorted(peers),
                 "online": sum(p in snapshot.online for p in peers)} for s, peers in sorted(stages.items())]

    def _gantt(self) -> dict:
        """The current schedule simulated (planned) beside the last iteration's measured spans
        per stage-0 peer (the peers report start and finish of each iteration)."""
        app = self.app
        planned: dict = {"epoch": None, "tasks": [], "total_s": None}
        if app.schedule is not None and getattr(app, "topology", None) is not None:
            if self._planned is None or self._planned[0] != app.schedule.epoch:
                self._planned = (app.schedule.epoch, self._simulate(app.schedule, app.topology))
            planned = self._planned[1]
        reports = getattr(app, "last_reports", {})
        measured = {"iteration": None, "spans": [], "total_s": None}
        if reports:
            t0 = min(r.started_at for r in reports.values())
            measured = {"iteration": next(iter(reports.values())).iteration,
                        "spans": [{"peer": p, "start": r.started_at - t0, "end": r.finished_at - t0}
                                  for p, r in sorted(reports.items())],
                        "total_s": max(r.finished_at for r in reports.values()) - t0}
        return {"planned": planned, "measured": measured}

    @staticmethod
    def _simulate(schedule, topology) -> dict:
        try:
            result = simulate(schedule, topology)
        except Exception as exc:  # a schedule the simulator cannot replay: say so on the page
            return {"epoch": schedule.epoch, "tasks": [], "total_s": None, "error": str(exc)}
        tasks = [{"peer": iv.node, "mb": iv.microbatch_id, "kind": iv.kind, "stage": iv.stage,
                  "start": iv.start, "end": iv.end} for iv in result.intervals[:PLANNED_TASKS_SHOWN]]
        return {"epoch": schedule.epoch, "tasks": tasks, "total_s": result.iteration_time_s}

    @staticmethod
    def _row(s) -> dict:
        return {"iteration": s.iteration, "epoch": s.epoch, "loss": _finite(s.loss), "duration_s": s.duration_s,
                "tokens_per_s": s.tokens / max(s.duration_s, 1e-9), "finished_at": s.finished_at,
                **{k: getattr(s, k) for k in COUNT_KINDS}}

    def _faults(self) -> list[dict]:
        """Membership events, re-plans and recoveries, newest last. Consecutive iterations that
        needed recovery make one entry, so a long partition cannot push the joins and
        departures out of the list."""
        faults = list(self.events) + self._recoveries()
        for r in self.app.replans:
            faults.append({"at": r["published_at"], "kind": "replan", "peer": None,
                           "text": f"epoch {r['epoch']} published for {r['peers']} peers, "
                                   f"from iteration {r['start_iteration']}"})
        return sorted(faults, key=lambda f: f["at"])[-100:]

    def _recoveries(self) -> list[dict]:
        runs: list[list] = []            # [first iteration, last iteration, counts, lost?, at]
        for s in self.app.summaries[-200:]:
            hit = {k: getattr(s, k) for k in COUNT_KINDS[1:] if getattr(s, k)}
            if not hit:
                continue
            run = runs[-1] if runs else None
            if run is not None and run[1] == s.iteration - 1 and run[3] == bool(s.lost):
                run[1], run[4] = s.iteration, s.finished_at
                for k, n in hit.items():
                    run[2][k] = run[2].get(k, 0) + n
            else:
                runs.append([s.iteration, s.iteration, hit, bool(s.lost), s.finished_at])
        return [{"at": at, "kind": "lost" if lost else "recovered", "peer": None,
                 "text": (f"iteration {first}" if first == last else f"iterations {first}-{last}") + ": "
                         + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in counts.items())}
                for first, last, counts, lost, at in runs]

    # -- Prometheus -------------------------------------------------------------------------
    def metrics(self) -> str:
        app, e = self.app, Exposition()
        snapshot = getattr(app, "snapshot", None) or SwarmSnapshot({}, {})
        e.gauge("skippipe_coordinator_peers", "peers by advertised state", len(snapshot.online), {"state": "online"})
        e.gauge("skippipe_coordinator_peers", "peers by advertised state",
                len(snapshot.adverts) - len(snapshot.online), {"state": "other"})
        e.gauge("skippipe_coordinator_peers", "peers by advertised state", len(app.bans.banned), {"state": "banned"})
        e.gauge("skippipe_coordinator_epoch", "epoch of the current schedule (0: none)",
                app.schedule.epoch if app.schedule else 0)
        e.gauge("skippipe_coordinator_predicted_iteration_seconds", "the planner's predicted iteration time",
                app.schedule.predicted_iteration_s if app.schedule else 0.0)
        e.counter("skippipe_coordinator_replans_total", "schedules published", len(app.replans))
        for result, n in app.bans.counts.items():
            e.counter("skippipe_coordinator_spot_checks_total", "spot-check reports read, by result", n,
                      {"result": result})
        e.counter("skippipe_coordinator_iterations_total", "iterations completed", len(app.summaries))
        last = app.summaries[-1] if app.summaries else None
        e.gauge("skippipe_coordinator_iteration", "last completed iteration (-1: none)", last.iteration if last else -1)
        e.gauge("skippipe_coordinator_iteration_seconds", "duration of the last iteration",
                last.duration_s if last else 0.0)
        e.gauge("skippipe_coordinator_tokens_per_second", "tokens/s of the last iteration",
                last.tokens / max(last.duration_s, 1e-9) if last else 0.0)
        e.gauge("skippipe_coordinator_loss", "training loss of the last iteration",
                last.loss if last else float("nan"))
        for kind in COUNT_KINDS:
            e.counter("skippipe_coordinator_microbatches_total", "microbatches by how they ended",
                      sum(getattr(s, kind) for s in app.summaries), {"outcome": kind})
        e.gauge("skippipe_coordinator_pending_reports", "iterations with reports waiting for other origins",
                len(app.progress.reports))
        e.gauge("skippipe_coordinator_memory_rss_bytes", "resident memory of this process", process_rss_bytes())
        return e.render()

    def routes(self) -> dict:
        def page() -> Response:
            return 200, "text/html; charset=utf-8", PAGE.read_bytes()

        def api() -> Response:
            return 200, "application/json", json.dumps(json_safe(self.status()), allow_nan=False).encode()

        def metrics() -> Response:
            return 200, CONTENT_TYPE, self.metrics().encode()
        return {"/": page, "/index.html": page, "/api/status": api, "/metrics": metrics}
