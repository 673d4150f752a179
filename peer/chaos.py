"""Fault injection for tests and demos (`skippipe-peer --fault SPEC`, `skippipe-swarm --chaos`).

SPEC is one or more comma-separated faults:
  kill@N[:when]   SIGKILL this peer during iteration N; `when` is forward (at its first forward
                  task, the default), backward (at its first backward task) or between (before
                  the iteration starts, i.e. between iterations N-1 and N). A peer with no such
                  task in iteration N dies at its first one in a later iteration.
  stall@N[:F]     from iteration N on, every compute task takes F times as long (default 10)
  corrupt@N[:S]   from iteration N on, this peer's forward outputs carry noise of S times their
                  RMS (default 0.2): a peer returning wrong activations, for spot checks to
                  catch. It still answers spot-check requests honestly (see docs/security.md, "Wrong results").
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
    action: str                       # kill | stall | corrupt
    iteration: int
    when: str = "forward"             # kill only
    factor: float = 10.0              # stall: slowdown; corrupt: noise relative to the output's RMS


def parse_faults(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        action, _, rest = part.partition("@")
        at, _, arg = rest.partition(":")
        if action not in ("kill", "stall", "corrupt") or not (at.isascii() and at.isdigit()):
            raise FaultSpecError(f"bad fault {part!r}: expected kill@N[:forward|backward|between], "
                                 f"stall@N[:FACTOR] or corrupt@N[:SCALE]")
        if action == "kill":
            when = arg or "forward"
            if when not in WHEN_KINDS:
                raise FaultSpecError(f"bad fault {part!r}: kill happens at forward, backward or between")
            faults.append(Fault("kill", int(at), when=when))
        elif action == "stall":
            factor = _number(part, arg, 10.0, "the stall factor")
            if factor < 1:
                raise FaultSpecError(f"bad fault {part!r}: the stall factor must be >= 1")
            faults.append(Fault("stall", int(at), factor=factor))
        else:
            scale = _number(part, arg, 0.2, "the corruption scale")
            if scale <= 0:
                raise FaultSpecError(f"bad fault {part!r}: the corruption scale must be > 0")
            faults.append(Fault("corrupt", int(at), factor=scale))
    return faults


def _number(part: str, arg: str, default: float, what: str) -> float:
    try:
        value = float(arg) if arg else default
    except ValueError:
        raise FaultSpecError(f"bad fault {part!r}: {what} must be a number") from None
    if not math.isfinite(value):
        raise FaultSpecError(f"bad fault {part!r}: {what} must be a finite number")
    return value


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


def corrupting(make_runner: Callable, faults: list[Fault]) -> Callable:
    """Wrap a stage-runner factory so that, from the corrupt fault's iteration on, forwards
    return noisy outputs. The stash keeps the true graph and spot-check recomputations
    (runner.recompute) stay honest: only what this peer hands the next hop is wrong."""
    corrupt = [f for f in faults if f.action == "corrupt"]
    if not corrupt:
        return make_runner
    import torch  # not at import time: the CLI parses --fault before torch is loaded
    start, scale = corrupt[0].iteration, corrupt[0].factor

    def noisy(key, out):
        if key[0] < start:
            return out
        x = out.float()
        return (x + scale * x.pow(2).mean().sqrt() * torch.randn_like(x)).to(out.dtype)

    def make(stage: int):
        runner = make_runner(stage)
        for name in ("forward", "forward_origin"):
            honest = getattr(runner, name)
            setattr(runner, name, lambda key, x, honest=honest: noisy(key, honest(key, x)))
        return runner
    return make
