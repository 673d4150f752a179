"""Where this peer stands in the run: the iteration in hand, the schedule it runs on, the
books of each iteration in hand (flights, attempts, own microbatches: flights.py) and the
outcomes of the finished ones. The worker writes it; recovery, averaging, the sender, the
handlers and the status pages read it instead of asking the worker."""
import torch

from protocol.schedule import Schedule

from peer.pipeline.flights import IterationOutcome, IterationState


class Ledger:
    def __init__(self, iteration: int = 0):
        self.iteration = iteration
        self.current: Schedule | None = None          # the schedule of the running iteration
        self.states: dict[int, IterationState] = {}
        self.targets: dict[tuple[int, int], torch.Tensor] = {}   # (iteration, mb) -> our labels
        self.awaiting_shares: set[str] = set()        # replicas whose gradient shares we wait for
        self.history: list[IterationOutcome] = []     # finished iterations, oldest first

    def typical_iteration_s(self) -> float:
        """The median of the last few finished iterations' durations (0: none yet)."""
        recent = sorted(o.finished_at - o.started_at for o in self.history[-5:] if o.finished_at)
        return recent[len(recent) // 2] if recent else 0.0

    def state(self, i: int) -> IterationState:
        return self.states.setdefault(i, IterationState(i))

    def get(self, i: int) -> IterationState | None:
        return self.states.get(i)

    def in_hand(self) -> IterationState | None:
        return self.states.get(self.iteration)

    def end(self, i: int) -> None:
        """Forget iteration i and everything before it."""
        for key in [k for k in self.targets if k[0] <= i]:
            del self.targets[key]
        for old in [k for k in self.states if k <= i]:
            del self.states[old]
