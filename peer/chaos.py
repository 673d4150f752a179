"""Fault injection for tests and demos (`skippipe-peer --fault SPEC`, `skippipe-swarm --chaos`).

SPEC is one or more comma-separated faults:
  kill@N[:when]   SIGKILL this peer during iteration N; `when` is forward (at its first forward
                  task, the default), backward (at its first backward task) or between (before
                  the iteration starts, i.e. between iterations N-1 and N). A peer with no such
                  task in iteration N dies at its first one in a later iteration.
  stall@N[:F]     from iteration N on, every compute task takes F times as long (default 10)
A kill is a real `kill -9` of our own process: no goodbye, no OFFLINE advert.
"""
import math
import os
import signal
from dataclasses import dataclass
from typing import Callable

WHEN_KINDS = {"forward": {"ORIGIN_FORWARD", "FORWARD"}, "backward": {"BACKWARD", "ORIGIN_BACKWARD"},
              "between": {"START"}}


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    action: str                       # kill | stall
    iteration: int
    when: str = "forward"             # kill only
    factor: float = 10.0              # stall only


def parse_faults(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        action, _, rest = part.partition("@")
        at, _, arg = rest.partition(":")
        if action not in ("kill", "stall") or not (at.isascii() and at.isdigit()):
            raise FaultSpecError(f"bad fault {part!r}: expected kill@N[:forward|backward|between] or stall@N[:FACTOR]")
        if action == "kill":
            when = arg or "forward"
            if when not in WHEN_KINDS:
                raise FaultSpecError(f"bad fault {part!r}: kill happens at forward, backward or between")
            faults.append(Fault("kill", int(at), when=when))
        else:
            try:
                factor = float(arg) if arg else 10.0
            except ValueError:
                raise FaultSpecError(f"bad fault {part!r}: the stall factor must be a number") from None
            if not math.isfinite(factor) or factor < 1:
                raise FaultSpecError(f"bad fault {part!r}: the stall factor must be >= 1")
            faults.append(Fault("stall", int(at), factor=factor))
    return faults


def make_hook(faults: list[Fault], set_slowdown: Callable[[float], None],
              kill: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGKILL)):
    """A worker fault hook: called with (iteration, task kind name or "START")."""
    def hook(iteration: int, kind: str) -> None:
        for f in faults:
            if f.action == "kill" and iteration >= f.iteration and kind in WHEN_KINDS[f.when]:
                kill()
            if f.action == "stall" and iteration >= f.iteration:
                set_slowdown(f.factor)
    return hook
