"""Which remote peers we currently trust to do work: failures, bans and departures.

A failure (RPC error, timeout, failed heartbeat) bans a peer for a capped exponential backoff
(base, 2x base, 4x base, ... up to `max_ban_s`); any success resets it. A peer that announced
OFFLINE or whose advert expired is `departed` until it announces again. Two rules from
architecture.md live here so they can be tested alone:
- "suspect" (consecutive failures >= threshold, or departed) is what triggers recovery of the
  work we handed to that peer;
- we never ban the last live replica of a stage: a flaky sole replica is still retried,
  because banning it would force skips that a transient error does not justify.
A peer that missed a hop deadline (peer/pipeline/hop_deadlines.py) is *late* for a while: it
answers pings, so failures and bans (which any success clears) cannot say it; no new work goes
to it until the mark lapses, and our advert names it for the coordinator.
"""
import time
from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass
class _Record:
    failures: int = 0                 # consecutive, reset on success
    banned_until: float = 0.0


class Health:
    def __init__(self, base_ban_s: float = 1.0, max_ban_s: float = 30.0, suspect_after: int = 3,
                 clock: Callable[[], float] = time.monotonic):
        if base_ban_s <= 0 or max_ban_s < base_ban_s or suspect_after < 1:
            raise ValueError("need 0 < base_ban_s <= max_ban_s and suspect_after >= 1")
        self.base_ban_s, self.max_ban_s, self.suspect_after = base_ban_s, max_ban_s, suspect_after
        self.clock = clock
        self._records: dict[str, _Record] = {}
        self.departed: set[str] = set()
        self._last_success: dict[str, float] = {}
        self._late_until: dict[str, float] = {}

    def record_success(self, peer: str) -> None:
        self._records.pop(peer, None)
        self._last_success[peer] = self.clock()

    def answered_within(self, peers: Iterable[str], seconds: float) -> str | None:
        """One of `peers` that took a call of ours in the last `seconds`, if any: our link works."""
        since = self.clock() - seconds
        return next((p for p in peers if self._last_success.get(p, -1.0) >= since), None)

    def record_failure(self, peer: str, replicas: Iterable[str] = ()) -> None:
        """Count a failure of `peer`; ban it unless it is its stage's last usable replica
        (`replicas` = every peer of its stage, itself included)."""
        rec = self._records.setdefault(peer, _Record())
        rec.failures += 1
        others = [p for p in replicas if p != peer]
        if replicas and not any(self.usable(p) for p in others):
            return
        backoff = min(self.base_ban_s * 2 ** (rec.failures - 1), self.max_ban_s)
        rec.banned_until = max(rec.banned_until, self.clock() + backoff)

    def forget_failures(self) -> None:
        """Clear every failure and ban: they were ours (we were cut off), not the peers'."""
        self._records.clear()

    def set_departed(self, peers: Iterable[str]) -> None:
        self.departed = set(peers)

    def banned(self, peer: str) -> bool:
        rec = self._records.get(peer)
        return rec is not None and rec.banned_until > self.clock()

    def failures(self, peer: str) -> int:
        rec = self._records.get(peer)
        return 0 if rec is None else rec.failures

    def suspect(self, peer: str) -> bool:
        """Treat the work we gave `peer` as lost: it left, or stopped answering."""
        return peer in self.departed or self.failures(peer) >= self.suspect_after

    def looks_gone(self, peer: str, witnesses: Iterable[str], after_failures: int, within_s: float) -> bool:
        """`peer` left (departed and failing), or failed `after_failures` calls in a row while one
        of `witnesses` took a call of ours in the last `within_s`. Silence with no witness says
        more about our own link (a relay that died, our uplink) than about `peer`: a stage-1 peer
        that took it for the origins' death ended hundreds of empty iterations in seconds and
        refused all work after (tests/swarm/test_nat.py)."""
        failures = self.failures(peer)
        if peer in self.departed and failures >= self.suspect_after:
            return True
        return failures >= after_failures and \
            self.answered_within((p for p in witnesses if p != peer), within_s) is not None

    def usable(self, peer: str) -> bool:
        """May we hand new work to `peer`?"""
        return not self.banned(peer) and not self.suspect(peer) and not self.late(peer)

    def mark_late(self, peer: str, for_s: float) -> None:
        self._late_until[peer] = max(self._late_until.get(peer, 0.0), self.clock() + for_s)

    def late(self, peer: str) -> bool:
        return self._late_until.get(peer, 0.0) > self.clock()

    def late_peers(self) -> tuple[str, ...]:
        """The peers marked late now (sorted); lapsed marks are forgotten."""
        now = self.clock()
        self._late_until = {p: t for p, t in self._late_until.items() if t > now}
        return tuple(sorted(self._late_until))

    def ban_remaining(self, peer: str) -> float:
        rec = self._records.get(peer)
        return 0.0 if rec is None else max(rec.banned_until - self.clock(), 0.0)

    def snapshot(self) -> dict[str, dict]:
        """For status output: peers with failures or bans."""
        out = {p: {"failures": r.failures, "ban_s": round(self.ban_remaining(p), 1)}
               for p, r in self._records.items()}
        for p in self.late_peers():
            out.setdefault(p, {"failures": 0, "ban_s": 0.0})["late_s"] = round(self._late_until[p] - self.clock(), 1)
        return out
