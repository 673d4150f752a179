"""The forward speed a peer measures while training and advertises (peer/pipeline/speed_meter.py)."""
import asyncio
import time

import pytest
import torch

from peer.compute.runner import StageRunner
from peer.pipeline.seat import StageSeat
from peer.pipeline.speed_meter import FRESH_S, PROBE_PERIOD_S, SpeedMeter
from protocol.messages import RunSpec


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_meter_averages_per_layer_and_sample_and_says_nothing_until_it_knows():
    clock = Clock()
    meter = SpeedMeter(clock)
    meter.observe(0.08, layers=2, samples=4)       # 10 ms per layer-sample
    meter.observe(0.08, layers=2, samples=4)
    assert meter.current() == 0.0                  # two forwards say little
    meter.observe(80.0, layers=2, samples=4)       # one forward stopped for a minute: bounded
    assert 0.01 < meter.current() <= 0.01 * (1 + 0.2 * 3)
    for _ in range(5):                             # a lasting slowdown still shows within a few
        meter.observe(0.8, layers=2, samples=4)
    assert meter.current() > 0.05
    meter.observe(0.0, layers=2, samples=4)        # nonsense is ignored
    meter.observe(0.08, layers=0, samples=4)
    assert meter.observations == 8


def test_a_stale_figure_is_withdrawn_and_an_idle_peer_is_due_a_probe():
    clock = Clock()
    meter = SpeedMeter(clock)
    assert meter.probe_due()
    for _ in range(3):
        meter.observe(0.08, layers=2, samples=4)
    assert not meter.probe_due() and meter.current() > 0
    clock.t += PROBE_PERIOD_S
    assert meter.probe_due()
    clock.t += FRESH_S
    assert meter.current() == 0.0


@pytest.fixture
def seat():
    spec = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, microbatch_samples=2, seq_len=16)
    s = StageSeat(lambda stage: StageRunner.from_spec(spec, stage))
    yield s
    s.close()


def test_the_seat_times_the_compute_of_a_forward_times_an_emulated_slowdown_not_its_queueing(seat):
    async def one(key, slowdown):
        seat.speed, seat.slowdown = SpeedMeter(), slowdown
        await seat.forward(seat.runner.forward, (0, key), torch.randn(2, 16, seat.runner.config.dim))
        return seat.speed.s_per_layer_sample

    async def go():
        await seat.take(1)
        for key in range(3):                         # warm-up
            await one(key, 1.0)
        hidden = torch.randn(2, 16, seat.runner.config.dim)
        seat.speed = SpeedMeter()
        blocker = seat.compute(time.sleep, 0.3)     # the compute thread is busy: the forward queues
        await asyncio.gather(blocker, seat.forward(seat.runner.forward, (0, 9), hidden))
        queued = seat.speed.s_per_layer_sample
        # interleaved, so that a burst of load on a busy machine (CI) hits both kinds alike
        normal, slowed = [], []
        for k in range(5):
            normal.append(await one(10 + k, 1.0))
            slowed.append(await one(20 + k, 10.0))
        return queued, min(normal), min(slowed)
    queued, normal, slowed = asyncio.run(go())
    assert queued < 0.3 / (2 * 2) / 3              # the 0.3 s in the queue is not counted
    assert slowed > 3 * normal                     # an emulated 10x slower device is


def test_an_idle_non_origin_stage_probes_its_speed_and_stage_0_does_not(seat):
    async def go(stage):
        await seat.take(stage)
        await seat.probe_speed(2, 16)
        return seat.speed.observations
    assert asyncio.run(go(1)) == 1
    seat.speed = SpeedMeter()
    assert asyncio.run(go(0)) == 0
