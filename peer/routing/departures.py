"""Which scheduled peers have left, judged from what the DHT shows us (pure, clock injected).

A peer that announced OFFLINE has left at once; one whose advert stays missing for `grace_s`
has left too. But absence is evidence only when the read itself is sound: a read that lost
our own advert, or most of the swarm at once, says more about our link or the DHT lookup than
about the others (a partition once made a healthy stage-0 peer declare every other peer
departed, and so lose every microbatch). Such a read is *unreliable*: it adds no departures
(peers that really died are still caught by failed heartbeats), and if it persists the peer
may be the one cut off, which `peer/isolation.py` checks by dialing.
"""
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from protocol.adverts import PeerState


@dataclass(frozen=True)
class Verdict:
    departed: frozenset[str]
    reliable: bool
    missing: int                     # scheduled peers (not us) absent from this read
    others: int                      # scheduled peers, not us


def unreliable(me: str, others: set[str], present: Iterable[str] | None) -> bool:
    """A read without our own advert, or missing more than half of (at least two) others."""
    if present is None:
        return True
    seen = set(present)
    missing = len(others - seen)
    return me not in seen or (len(others) >= 2 and 2 * missing > len(others))


class DepartureWatch:
    def __init__(self, me: str, grace_s: float, clock: Callable[[], float] = time.monotonic):
        if grace_s <= 0:
            raise ValueError("grace_s must be positive")
        self.me, self.grace_s, self.clock = me, grace_s, clock
        self._missing_since: dict[str, float] = {}
        self._departed: frozenset[str] = frozenset()

    def observe(self, scheduled: Iterable[str], adverts: Mapping[str, PeerState] | None) -> Verdict:
        """One DHT read: `adverts` maps peer -> advertised state (None: no record found)."""
        others = set(scheduled) - {self.me}
        now = self.clock()
        seen = adverts or {}
        offline = {p for p in others if seen.get(p) == PeerState.OFFLINE}
        missing = {p for p in others if p not in seen}
        if unreliable(self.me, others, None if adverts is None else seen.keys()):
            # keep what we decided on sound reads (minus peers now seen alive); add only goodbyes
            self._departed = frozenset((self._departed & missing) | offline)
            return Verdict(self._departed, False, len(missing), len(others))
        for p in others - missing:
            self._missing_since.pop(p, None)
        for p in set(self._missing_since) - others:
            del self._missing_since[p]
        late = {p for p in missing if now - self._missing_since.setdefault(p, now) >= self.grace_s}
        self._departed = frozenset(offline | late)
        return Verdict(self._departed, True, len(missing), len(others))
