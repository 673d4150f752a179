"""How fast this peer's stage really computes, measured while it trains (issue 25).

The advert's `fwd_s_per_layer_sample` is a benchmark taken at start-up; a machine that slows
down later (another job, thermal throttling, a laptop on battery) or whose benchmark was wrong
would keep its place in the plan. The worker times every forward it runs (wall time, as the
swarm waits for it: queueing on the compute thread included), the meter keeps a moving
average per layer and sample, and the peer advertises it as `measured_fwd_s_per_layer_sample`;
the coordinator compares it with the rest of the swarm and demotes peers that fall far behind.

A peer the plan gives no forwards (demoted, or idle) would never prove it is fast again, so
it times a probe forward on random input every PROBE_PERIOD_S while it has no work."""
import logging
import time
from typing import Callable

import torch

logger = logging.getLogger(__name__)

EWMA_WEIGHT = 0.2          # of the newest observation: about the last 5-10 forwards count
FRESH_S = 60.0             # a figure older than this is no longer advertised
PROBE_PERIOD_S = 10.0      # while no forward came for this long, time a probe this often
MIN_OBSERVATIONS = 3       # before that the average says little
OUTLIER_CAP = 4.0          # one forward counts as at most this many times the average: a forward
                           # the OS stopped (SIGSTOP, a suspended laptop) is not the machine's speed


class SpeedMeter:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.s_per_layer_sample: float | None = None
        self.observations = 0
        self.last_at = float("-inf")

    def observe(self, seconds: float, layers: int, samples: int) -> None:
        if layers <= 0 or samples <= 0 or not seconds > 0:
            return
        figure = seconds / (layers * samples)
        prev = self.s_per_layer_sample
        if prev is not None:
            figure = min(figure, OUTLIER_CAP * prev)
        self.s_per_layer_sample = figure if prev is None else prev + EWMA_WEIGHT * (figure - prev)
        self.observations += 1
        self.last_at = self.clock()

    def current(self) -> float:
        """The figure to advertise: 0.0 while unknown or stale (the coordinator then uses none)."""
        if self.observations < MIN_OBSERVATIONS or self.clock() - self.last_at > FRESH_S:
            return 0.0
        return self.s_per_layer_sample

    def probe_due(self) -> bool:
        return self.clock() - self.last_at >= PROBE_PERIOD_S


def probe_forward(runner, samples: int, seq_len: int) -> bool:
    """One forward of the stage on random input, nothing stashed (False: no probe possible:
    stage 0 takes tokens, or the optimizer is stepping). Runs on the compute thread."""
    if runner is None or runner.is_origin:
        return False
    hidden = torch.randn(samples, seq_len, runner.config.dim)
    return runner.recompute(hidden, runner.step_count) is not None


def stage_layers(runner) -> int:
    return len(runner.module.layers.blocks) if runner is not None else 0
