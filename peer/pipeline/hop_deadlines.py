"""Hop deadlines: how long a peer we handed a microbatch to may keep it before we route around it.

Heartbeats find a peer that stopped answering (SIGSTOP, a dead link). They cannot find one that
answers pings but does not do the work: a hung compute thread, a volunteer that drops what it
is sent, a machine so loaded that one hop takes minutes. That peer's microbatches used to wait
out the 120 s iteration timeout and count lost.

Every flight (a microbatch we sent on and wait to get the gradient of) has a deadline derived
from what this peer measured of its own completed flights: the seconds from our send to the
gradient's return, per hop still ahead of it (link and compute times both, as they are on this
swarm, queues included). A flight with `remaining` hops ahead is due within
`remaining * (floor_s + factor * slowest per-hop time of the last `window` flights)`. Per hop,
so a peer deeper in the route, whose own deadline is shorter, routes around a stalled peer
before an earlier hop's deadline blames its innocent successor for the wait. The floor keeps a
loaded machine's hiccups (seconds) from rerouting; until `min_samples` flights completed there
is no deadline (warm-up), only the iteration timeout.
"""
import collections
from dataclasses import dataclass


@dataclass(frozen=True)
class DeadlinePolicy:
    floor_s: float = 4.0          # per hop still ahead
    factor: float = 3.0           # times the slowest per-hop time of the window
    window: int = 32              # completed flights remembered
    min_samples: int = 4

    def __post_init__(self):
        if self.floor_s <= 0 or self.factor < 1 or self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError("need floor_s > 0, factor >= 1 and 1 <= min_samples <= window")


class HopDeadlines:
    def __init__(self, policy: DeadlinePolicy = DeadlinePolicy()):
        self.policy = policy
        self._per_hop_s: collections.deque[float] = collections.deque(maxlen=policy.window)

    def completed(self, seconds: float, remaining: int) -> None:
        """A flight came back `seconds` after we sent it, with `remaining` hops ahead of it then."""
        if remaining >= 1 and seconds >= 0:
            self._per_hop_s.append(seconds / remaining)

    def deadline_s(self, remaining: int) -> float | None:
        """Seconds a flight with `remaining` hops ahead may take; None while warming up."""
        if len(self._per_hop_s) < self.policy.min_samples or remaining < 1:
            return None
        return remaining * (self.policy.floor_s + self.policy.factor * max(self._per_hop_s))

    def overdue(self, sent_at: float, remaining: int, now: float) -> bool:
        deadline = self.deadline_s(remaining)
        return deadline is not None and sent_at > 0 and now - sent_at > deadline

    def describe(self) -> str:
        if len(self._per_hop_s) < self.policy.min_samples:
            return f"warming up ({len(self._per_hop_s)}/{self.policy.min_samples} flights timed)"
        return f"{self.deadline_s(1):.1f} s per hop ahead (slowest hop lately {max(self._per_hop_s):.2f} s)"
