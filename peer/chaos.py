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
  badgrad@N[:S]   from iteration N on, the input gradients this peer's backwards return are
                  multiplied by S (default -100): wrong backward gradients, for backward spot
                  checks to catch (its own parameter gradients and spot-check answers stay honest).
  lie@N[:F]       from iteration N on, this peer's advert claims a measured forward speed F times
                  faster than it measures (default 10): with stall, a peer slower than it says,
                  for the origins' witnessed round trips to catch (coordinator/witnessed_speed.py).
  hang@N[:S]      from iteration N on, for S seconds (default 20) from the first one, this peer
                  takes the forwards it is sent and never runs them, while it answers pings: a hung
                  worker or a volunteer that drops work, for hop deadlines to catch
                  (peer/pipeline/hop_deadlines.py).
A kill is a real `kill -9` of our own process: no goodbye, no OFFLINE advert.
"""
import math
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

WHEN_KINDS = {"forward": {"ORIGIN_FORWARD", "FORWARD"}, "backward": {"BACKWARD", "ORIGIN_BACKWARD"},
              "between": {"START"}}


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    action: str                       # kill | stall | corrupt | badgrad | lie | hang
    iteration: int
    when: str = "forward"             # kill only
    factor: float = 10.0              # stall: slowdown; corrupt: noise relative to the output's RMS;
    #                                   badgrad: the factor on the returned gradient; lie: how much
    #                                   faster the advert claims it is; hang: seconds


def parse_faults(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        action, _, rest = part.partition("@")
        at, _, arg = rest.partition(":")
        if action not in ("kill", "stall", "corrupt", "badgrad", "lie", "hang") or not (at.isascii() and at.isdigit()):
            raise FaultSpecError(f"bad fault {part!r}: expected kill@N[:forward|backward|between], "
                                 f"stall@N[:FACTOR], corrupt@N[:SCALE], badgrad@N[:SCALE], lie@N[:FACTOR] "
                                 f"or hang@N[:SECONDS]")
        if action == "kill":
            when = arg or "forward"
            if when not in WHEN_KINDS:
                raise FaultSpecError(f"bad fault {part!r}: kill happens at forward, backward or between")
            faults.append(Fault("kill", int(at), when=when))
        elif action in ("stall", "lie"):
            factor = _number(part, arg, 10.0, f"the {action} factor")
            if factor < 1:
                raise FaultSpecError(f"bad fault {part!r}: the {action} factor must be >= 1")
            faults.append(Fault(action, int(at), factor=factor))
        elif action == "hang":
            seconds = _number(part, arg, 20.0, "the hang's seconds")
            if seconds <= 0:
                raise FaultSpecError(f"bad fault {part!r}: the hang lasts > 0 seconds")
            faults.append(Fault("hang", int(at), factor=seconds))
        elif action == "badgrad":
            scale = _number(part, arg, -100.0, "the gradient factor")
            if scale == 1:
                raise FaultSpecError(f"bad fault {part!r}: a gradient factor of 1 changes nothing")
            faults.append(Fault("badgrad", int(at), factor=scale))
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
              kill: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGKILL),
              clock: Callable[[], float] = time.monotonic):
    """A worker fault hook: called with (iteration, task kind name or "START"); True: drop the
    task (hang)."""
    hang_began: dict[Fault, float] = {}

    def hanging(f: Fault, iteration: int, kind: str) -> bool:
        if iteration < f.iteration or kind != "FORWARD":
            return False
        began = hang_began.setdefault(f, clock())
        return clock() - began < f.factor

    def hook(iteration: int, kind: str) -> bool:
        for f in faults:
            if f.action == "kill" and iteration >= f.iteration and kind in WHEN_KINDS[f.when]:
                kill()
            if f.action == "stall" and iteration >= f.iteration:
                set_slowdown(f.factor)
        return any(hanging(f, iteration, kind) for f in faults if f.action == "hang")
    return hook


def claimed_speed(faults: list[Fault]) -> Callable[[int, float], float]:
    """(iteration, measured seconds per layer and sample) -> what the advert says: the lie
    fault's figure from its iteration on, the measured one otherwise."""
    lie = next((f for f in faults if f.action == "lie"), None)

    def claim(iteration: int, measured: float) -> float:
        return measured / lie.factor if lie is not None and iteration >= lie.iteration else measured
    return claim


def corrupting(make_runner: Callable, faults: list[Fault]) -> Callable:
    """Wrap a stage-runner factory so that, from the corrupt fault's iteration on, forwards
    return noisy outputs, and from the badgrad fault's, backwards return scaled input gradients.
    The stash keeps the true graph and spot-check recomputations (runner.recompute) stay honest:
    only what this peer hands the next (or previous) hop is wrong."""
    corrupt = [f for f in faults if f.action == "corrupt"]
    badgrad = [f for f in faults if f.action == "badgrad"]
    if not corrupt and not badgrad:
        return make_runner
    import torch  # not at import time: the CLI parses --fault before torch is loaded

    def noisy(key, out):
        start, scale = corrupt[0].iteration, corrupt[0].factor
        if key[0] < start:
            return out
        x = out.float()
        return (x + scale * x.pow(2).mean().sqrt() * torch.randn_like(x)).to(out.dtype)

    def scaled(key, grad):
        return grad * badgrad[0].factor if key[0] >= badgrad[0].iteration else grad

    def make(stage: int):
        runner = make_runner(stage)
        for name in ("forward", "forward_origin") if corrupt else ():
            honest = getattr(runner, name)
            setattr(runner, name, lambda key, x, honest=honest: noisy(key, honest(key, x)))
        if badgrad:
            honest_backward = runner.backward
            runner.backward = lambda key, g, *rest: scaled(key, honest_backward(key, g, *rest))
        return runner
    return make
