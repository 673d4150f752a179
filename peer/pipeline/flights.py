"""Per-iteration bookkeeping of the microbatches that pass through this peer (and the data
records the worker passes around: Work, IterationOutcome).

Recovery re-sends a microbatch with a higher `attempt` (and the route it now takes), so every
peer keeps, per microbatch: the newest attempt it accepted (older ones are stale, an equal one
is a duplicate of a retried send), the flight it is waiting on (who owes it the backward), and
whether its parameters already received this microbatch's gradient (a replay through a stage
that already counted it only passes gradients on: counted once). Origins also track how each
of their microbatches ends, for exactly-once accounting.
"""
import collections
import time
from dataclasses import dataclass, field

import torch

from protocol.messages import MAX_ROUND_TRIP_S, MAX_TIMED_MICROBATCHES
from protocol.schedule import Route

from peer.pipeline.plan_view import Kind
from swarmcore.outcomes import OUTCOMES, Outcome

ATTEMPT_SLOTS = 64


def next_attempt(current: int, hop_index: int) -> int:
    """A replay's attempt: a new round, and within a round an upstream hop's replay beats a
    downstream one (it restarts the microbatch from earlier, which supersedes the rest)."""
    return (current // ATTEMPT_SLOTS + 1) * ATTEMPT_SLOTS + (ATTEMPT_SLOTS - 1 - min(hop_index, ATTEMPT_SLOTS - 1))


@dataclass
class Flight:
    """A microbatch stashed here, waiting for its backward from `successor`."""

    route: Route
    hop_index: int                    # our hop (0 at the origin)
    attempt: int                      # the attempt we sent on (and expect back)
    successor: str                    # the peer that owes us the backward
    upstream_attempt: int = 0         # the attempt our predecessor sent us (and expects back)
    # peers that would not take it this iteration: not tried again (two replicas that both said
    # ITERATION_OVER once bounced it between them until the iteration timed out)
    refused: set[str] = field(default_factory=set)
    # how often each peer failed it while it looked dead: recovery's last resort tries one again
    # (a dropped relay connection is not a death) but not twice (two killed replicas of a stage
    # once bounced a microbatch between them 300 times in 0.3 s)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    holding: bool = False             # its origin waits for a silent replica to answer (recovery.py)
    holds: int = 0                    # how often it was held (bounded: a peer that answers pings
                                      # but fails every send must not cycle it until the timeout)
    # sent to a peer recovery knew was late or suspect, for want of any other: its own hop
    # deadline judges it, not that peer's earlier lateness
    last_resort: bool = False
    sent_at: float = 0.0              # monotonic time the successor took it (0: not yet): its hop
    returned_at: float = 0.0          # deadline runs from there (hop_deadlines.py) until its gradient came

    @property
    def hops_ahead(self) -> int:
        """Hops after ours, the origin's head included: what the flight waits on."""
        return len(self.route.hops) - self.hop_index


@dataclass
class OriginEntry:
    """One of our own microbatches (origin only)."""

    planned: Route
    attempt: int = 0
    reissued: bool = False
    outcome: Outcome | None = None
    head_route: Route | None = None   # route of the attempt whose head we computed
    head_attempt: int = -1
    loss_sum: float = 0.0
    positions: tuple[int, ...] = ()   # the global sample positions it trains
    sent_at: float = 0.0              # monotonic time its first forward left (0: not yet)


@dataclass
class IterationState:
    iteration: int
    seen: dict[tuple[int, Kind], int] = field(default_factory=dict)   # newest accepted attempt
    flights: dict[int, Flight] = field(default_factory=dict)
    counted: set[int] = field(default_factory=set)
    own: dict[int, OriginEntry] = field(default_factory=dict)
    done_origins: set[str] = field(default_factory=set)

    def check_attempt(self, mb: int, kind: Kind, attempt: int) -> str | None:
        """Why an incoming input is refused ("stale"/"duplicate"), or None if it is new."""
        have = self.seen.get((mb, kind), -1)
        if attempt < have:
            return "stale"
        if attempt == have:
            return "duplicate"
        return None

    def record_attempt(self, mb: int, kind: Kind, attempt: int) -> None:
        self.seen[(mb, kind)] = max(attempt, self.seen.get((mb, kind), -1))

    def expects_backward(self, mb: int, attempt: int, sender: str) -> str | None:
        """Why a backward for `mb` is not the one we wait for; None if it is."""
        flight = self.flights.get(mb)
        if flight is None:
            return f"microbatch {mb} is not waiting for a backward here"
        if attempt != flight.attempt:
            return f"attempt {attempt} of microbatch {mb} is superseded (we hold {flight.attempt})"
        if sender != flight.successor:
            return f"{sender[:12]} does not owe us microbatch {mb}'s backward"
        return None

    def unresolved(self) -> list[int]:
        return sorted(mb for mb, e in self.own.items() if e.outcome is None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for e in self.own.values():
            if e.outcome is not None:
                out[Outcome(e.outcome).value] += 1
        return out


@dataclass
class Work:
    """An input waiting in the inbox: the tensor, the route and attempt it came with."""

    tensor: torch.Tensor
    route: Route
    attempt: int
    sender: str


@dataclass
class IterationOutcome:
    iteration: int
    epoch: int
    stage: int
    counts: dict[str, int] = field(default_factory=dict)
    loss_sum: float = 0.0
    samples: int = 0
    stages_visited: int = 0
    started_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    timed_out: bool = False
    positions: list[int] = field(default_factory=list)          # samples trained (origin)
    lost_microbatches: list[int] = field(default_factory=list)
    round_trips: dict[int, float] = field(default_factory=dict)  # completed on its planned route (origin)

    @property
    def completed(self) -> int:
        return self.counts.get(Outcome.COMPLETED, 0)

    def timed_fields(self) -> dict:
        """IterationReport's round-trip fields (the first MAX_TIMED_MICROBATCHES by id)."""
        timed = sorted(self.round_trips)[:MAX_TIMED_MICROBATCHES]
        return {"timed_microbatches": tuple(timed),
                "round_trip_s": tuple(min(self.round_trips[mb], MAX_ROUND_TRIP_S) for mb in timed)}

    @property
    def lost(self) -> int:
        return self.counts.get(Outcome.LOST, 0)
