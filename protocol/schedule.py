"""The schedule the coordinator publishes: stage assignment, routes and per-peer order."""
from dataclasses import dataclass
from enum import IntEnum

from protocol.errors import FieldError
from protocol.ids import check_run_name
from protocol.quantised import CODECS


class Phase(IntEnum):
    FORWARD = 0
    BACKWARD = 1


@dataclass(frozen=True)
class Hop:
    stage: int
    peer: str

    def __post_init__(self):
        if self.stage < 0:
            raise FieldError("stage", "must be >= 0")


@dataclass(frozen=True)
class Route:
    """One microbatch's path. hops[0] is its stage-0 origin; after the last hop the
    activation returns to the origin for the head and loss; backward runs in reverse."""

    microbatch_id: int
    hops: tuple[Hop, ...]

    def __post_init__(self):
        if not self.hops:
            raise FieldError("hops", "a route needs at least its origin hop")

    @property
    def origin(self) -> str:
        return self.hops[0].peer

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(h.stage for h in self.hops)


@dataclass(frozen=True)
class OrderEntry:
    microbatch_id: int
    phase: Phase


@dataclass(frozen=True)
class PeerOrder:
    """The order in which one peer processes its forward/backward tasks."""

    peer: str
    tasks: tuple[OrderEntry, ...]


@dataclass(frozen=True)
class StageAssignment:
    peer: str
    stage: int


@dataclass(frozen=True)
class LinkCodec:
    """v1.6: the planner's choice for one directed link: what `sender` sends `receiver`
    (activations forward and gradients backward) is quantised with `codec`. A link not listed
    carries floats, as before 1.6."""

    sender: str
    receiver: str
    codec: str

    def __post_init__(self):
        if self.codec not in CODECS:
            raise FieldError("codec", f"unknown codec {self.codec!r}; one of {list(CODECS)}")


@dataclass(frozen=True)
class Schedule:
    run: str
    epoch: int                                   # strictly increasing; peers reject older
    strategy: str                                # "skippipe", "full", "random-skip"
    num_stages: int
    skip_ratio: float
    assignment: tuple[StageAssignment, ...]
    routes: tuple[Route, ...]
    order: tuple[PeerOrder, ...] = ()
    predicted_iteration_s: float = 0.0
    seed: int = 0
    start_iteration: int = 0                     # first iteration this epoch applies to
    # v1.3, the global sample cursor (tokendata/cursor.py): the first fresh sample position at
    # start_iteration, and positions lost earlier that this epoch trains first
    data_base: int = 0
    data_retry: tuple[int, ...] = ()
    wire: tuple[LinkCodec, ...] = ()             # v1.6: quantised links (older peers drop it: floats)

    def __post_init__(self):
        check_run_name(self.run)
        if self.epoch < 0:
            raise FieldError("epoch", "must be >= 0")
        if self.num_stages < 1:
            raise FieldError("num_stages", "must be >= 1")
        if not 0.0 <= self.skip_ratio < 1.0:
            raise FieldError("skip_ratio", "must be in [0, 1)")
        if self.data_base < 0 or any(p < 0 for p in self.data_retry):
            raise FieldError("data_base", "sample positions must be >= 0")
        if len(set(self.data_retry)) != len(self.data_retry):
            raise FieldError("data_retry", "a sample position is listed twice")

    def stage_of(self) -> dict[str, int]:
        return {a.peer: a.stage for a in self.assignment}

    def route(self, microbatch_id: int) -> Route:
        for r in self.routes:
            if r.microbatch_id == microbatch_id:
                return r
        raise KeyError(microbatch_id)


SCHEDULE_FORMAT = "skippipe-schedule/1"


def schedule_to_json(schedule: Schedule) -> str:
    import json

    from protocol.plain import to_plain
    return json.dumps({"format": SCHEDULE_FORMAT, "schedule": to_plain(schedule)}, indent=1)


def schedule_from_json(text: str) -> Schedule:
    """Parse a schedule file; raises FieldError (a DecodeError) naming the field."""
    import json

    from protocol.plain import from_plain
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, nesting
        raise FieldError("<file>", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        raise FieldError("format", f"expected {SCHEDULE_FORMAT!r}")
    return from_plain(Schedule, data.get("schedule"), "schedule")
