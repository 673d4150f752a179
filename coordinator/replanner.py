"""When to (re-)plan: pure rules with hysteresis, so one flapping peer cannot cause a storm.

- first plan: as soon as at least `min_peers` are online and the membership has been stable
  for `hold_s` (peers usually arrive together);
- re-plan: the online membership differs from the planned one and has been stable for
  `hold_s`, and at least `min_gap_s` passed since the last plan.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplanPolicy:
    min_peers: int = 1
    hold_s: float = 2.0
    min_gap_s: float = 5.0


@dataclass
class MembershipTracker:
    policy: ReplanPolicy
    members: frozenset[str] = frozenset()
    changed_at: float = 0.0
    planned: frozenset[str] | None = None
    planned_at: float = float("-inf")

    def observe(self, members: frozenset[str], now: float) -> None:
        if members != self.members:
            self.members, self.changed_at = members, now

    def should_plan(self, now: float) -> bool:
        if self.members == self.planned or len(self.members) < self.policy.min_peers:
            return False
        if now - self.changed_at < self.policy.hold_s:
            return False
        return self.planned is None or now - self.planned_at >= self.policy.min_gap_s

    def planned_now(self, now: float) -> None:
        self.planned, self.planned_at = self.members, now
