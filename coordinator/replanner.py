"""When to (re-)plan: pure rules with hysteresis, so one flapping peer cannot cause a storm.

Each peer's presence is debounced on its own: a peer joins the planning membership once it
has been online for `hold_s`, and leaves it once it has been gone for `hold_s`. A peer that
flaps faster than that keeps its previous standing, and cannot delay the reaction to anyone
else's arrival or death.
- first plan: as soon as at least `min_peers` debounced members exist (later re-plans
  go ahead with fewer: the swarm must route around its dead); with min_peers > 1 (the
  operator said how many to wait for: skippipe-swarm's --peers) once that many are online,
  undebounced: a peer that flaps meanwhile costs a re-plan, as it would have after the hold;
- re-plan: the debounced membership differs from the planned one and at least `min_gap_s`
  passed since the last plan (so even a slowly flapping peer costs at most one plan per gap).
"""
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplanPolicy:
    min_peers: int = 1
    hold_s: float = 2.0
    min_gap_s: float = 5.0


@dataclass
class PresenceTracker:
    """Which peers are online, debounced per peer, and when that set calls for a re-plan.
    (Presence, not membership: membership is the join key's admission, protocol/membership.py.)"""
    policy: ReplanPolicy
    members: frozenset[str] = frozenset()     # debounced
    changed_at: float = 0.0                   # when `members` last changed
    planned: frozenset[str] | None = None
    planned_at: float = float("-inf")
    seen: dict[str, tuple[bool, float]] = field(default_factory=dict)   # raw presence, since when

    def observe(self, online: frozenset[str], now: float) -> None:
        for peer in set(online) | set(self.seen):
            present = peer in online
            if peer not in self.seen or self.seen[peer][0] != present:
                self.seen[peer] = (present, now)
        self._refresh(now)

    def _refresh(self, now: float) -> None:
        hold = self.policy.hold_s
        online = frozenset(p for p, (present, _) in self.seen.items() if present)
        if self.planned is None and self.policy.min_peers > 1 and len(online) >= self.policy.min_peers:
            members = online   # every peer the first plan waits for is here: holding would only delay it
        else:
            members = frozenset(p for p, (present, since) in self.seen.items()
                                if (present and now - since >= hold)
                                or (not present and now - since < hold and p in self.members))
        for p in [p for p, (present, since) in self.seen.items() if not present and now - since > 10 * hold]:
            del self.seen[p]   # long gone: forget
        if members != self.members:
            self.members, self.changed_at = members, now

    def absent_for(self, peer: str, now: float) -> float:
        """How long `peer` has been missing from every read (0 while present; inf if never seen
        or long forgotten)."""
        present, since = self.seen.get(peer, (False, float("-inf")))
        return 0.0 if present else now - since

    def should_plan(self, now: float) -> bool:
        self._refresh(now)
        if self.members == self.planned or not self.members:
            return False
        if self.planned is None and len(self.members) < self.policy.min_peers:
            return False   # min_peers gates the first plan only: after a death we must re-plan
        return self.planned is None or now - self.planned_at >= self.policy.min_gap_s

    def gap_passed(self, now: float) -> bool:
        """A plan exists and another may follow it now (for re-plans not caused by presence)."""
        return self.planned is not None and now - self.planned_at >= self.policy.min_gap_s

    def planned_now(self, now: float) -> None:
        self._refresh(now)
        self.planned, self.planned_at = self.members, now


SLOW_READ_S = 2.5   # a read of the adverts this slow waited out a DHT RPC timeout (3 s in hivemind)


@dataclass
class CollapseGuard:
    """A read of the adverts that lost most of the swarm at once is more likely a DHT lookup
    that failed (a partition stalls lookups that touch the cut-off node) than a mass departure:
    keep the previous view for up to `hold_s` before believing it. So is a read that lost
    anyone while the DHT was stalling (it took `slow_read_s` or more): healthy peers' stores
    stall then too, and their adverts can lapse for a moment (seen in CI with one of four)."""
    hold_s: float = 15.0
    slow_read_s: float = SLOW_READ_S
    since: float | None = None

    def accept(self, previous: frozenset[str], online: frozenset[str], now: float, read_s: float = 0.0) -> bool:
        lost = len(previous - online)
        collapse = len(previous) >= 2 and 2 * lost > len(previous)
        if collapse or (lost and read_s >= self.slow_read_s):
            if self.since is None:
                self.since = now
            if now - self.since < self.hold_s:
                return False
        self.since = None
        return True


EARLY_ITERATION_S = 0.25


def switch_iteration(latest: int, recent_durations: list[float], since_latest_s: float, margin_s: float,
                     running_s: float = 0.0) -> int:
    """The first iteration of a new epoch: safely after the swarm's current one, which is later
    than the newest we know of (`latest`, reported `since_latest_s` ago). Counted at the pace
    the swarm goes now: the slower of its fastest recent iteration, the mean of its last two, and
    `running_s` (how long its current iteration has run so far). A swarm that crawls around a
    stopped peer goes on crawling until the new epoch takes effect; counted at its fastest pace,
    a 30 s stop put the epoch 20 iterations ahead, reached only after the peer was back
    (bench/faults.py). An origin that reads the epoch too late misses it harmlessly
    (coordinator/epoch_uptake.py: published again, with a wider margin). Not the mean alone:
    a slow first iteration (warm-up) once made the margin so short that the swarm had already
    passed the start. With fewer than three measured iterations the rate is a guess: assume a
    fast swarm (EARLY_ITERATION_S)."""
    durations = [d for d in recent_durations if d > 0]
    measured = len(durations) >= 3
    per_iteration = max(min(durations + ([] if measured else [EARLY_ITERATION_S])), 0.05)
    if measured:
        per_iteration = max(per_iteration, sum(durations[-2:]) / 2, running_s)
    return latest + 2 + math.ceil((margin_s + max(0.0, since_latest_s)) / per_iteration)


def switch_from_progress(latest: int, recent_durations: list[float], since_latest_s: float, margin_s: float,
                         freshest: tuple[int, float] | None, now: float, running_s: float = 0.0) -> int:
    """switch_iteration, bounded by the freshest dated progress record: a record stored `age`
    seconds ago said its origin had finished iteration `newest`; stage 0 averages in step, so
    no origin is more than one iteration past it, plus what it could do since. While the swarm
    stalls, records stay fresh (peers re-store them every few seconds) and the new epoch starts
    near the swarm instead of where it would be had it gone on at its fastest pace (issue 25:
    a 30 s stop once put a re-plan 110 iterations ahead)."""
    estimate = switch_iteration(latest, recent_durations, since_latest_s, margin_s, running_s)
    if freshest is None:
        return estimate
    newest, written_at = freshest
    bound = switch_iteration(newest + 1, recent_durations, max(0.0, now - written_at), margin_s, running_s)
    return max(latest + 2, min(estimate, bound))


PULL_IN_MIN_GAIN = 3   # iterations sooner, at least, for an epoch to be published again nearer


def pulled_in_start(planned_start: int, latest: int, fresh_start: int, published_s_ago: float,
                    margin_s: float) -> int | None:
    """A start for the newest epoch nearer than the one it was published with, or None.
    A re-plan decided while the DHT stalled (a stopped peer stalls the stores that touch it)
    can see neither a slow iteration nor a fresh progress record, count at the fastest pace,
    and start 27 iterations ahead of a swarm that then crawls until the epoch begins
    (bench/faults.py, a 30 s stop). Once the epoch has been out for a margin (the pace it was
    counted at had time to show itself) and the start counted now (`fresh_start`, at the pace
    the swarm shows now) is at least PULL_IN_MIN_GAIN iterations sooner, the same routes go
    out again from there: the peers take the newer epoch, and the far one never runs."""
    if published_s_ago < margin_s or planned_start <= latest + 2:
        return None
    return fresh_start if planned_start - fresh_start >= PULL_IN_MIN_GAIN else None


def republish_start(next_start: int, newest_start: int) -> int:
    """Where the current routes go out again as a new epoch (a missed or split epoch, or lost
    samples to train again): the next safe start. When the newest epoch starts later than that
    (a re-plan counted at a pace the swarm lost), it is superseded, as _pull_in_far_start does:
    waiting for it to begin kept a split swarm (origins on two epochs, non-origins refusing one
    of them) losing microbatches for 2.5 minutes (bench/faults.py, issue 25). Never at the
    newest epoch's own start: two epochs from one iteration would leave its origins' uptake
    unclear."""
    return next_start + 1 if next_start == newest_start else next_start
