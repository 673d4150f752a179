"""Delayed parameter updates (RunSpec.gradient_exchange "delayed", peer/pipeline/averaging.py):
iteration i's average is applied at the end of iteration i + 1, so the replicas' exchange is off
the critical path. Replicas stay bit-identical, the run ends with every update applied, an
epoch's first iteration is synchronous, and training still lowers the loss like the
synchronous exchange."""
import asyncio

import pytest
import torch

from protocol import messages as m

from bench.support.memory_swarm import batches_for, make_schedule, run_memory_swarm

SPEC = m.RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, seed=7, microbatch_samples=2, seq_len=16,
                 microbatches_per_origin=2, max_steps=4, learning_rate=3e-3, warmup_steps=1,
                 gradient_exchange="delayed")
STAGE_OF = {"a0": 0, "b0": 0, "a1": 1, "b1": 1}
PATHS = {0: ["a0", "a1"], 1: ["a0", "b1"], 2: ["b0", "b1"], 3: ["b0", "a1"]}


def run(spec: m.RunSpec, share_dtype: str = "int8", batch=None):
    batch = batch or batches_for(spec)[0]
    return asyncio.run(run_memory_swarm(spec, make_schedule("t", STAGE_OF, PATHS), batch, share_dtype=share_dtype))


def same_batches(spec: m.RunSpec):
    """The same tokens every iteration (per origin and microbatch): a loss that can fall far."""
    fixed = {}

    def batch(iteration: int, local: int, shard: int, shards: int, positions=None):
        if (local, shard) not in fixed:
            gen = torch.Generator().manual_seed(1000 * shard + local)
            t = torch.randint(0, 256, (spec.microbatch_samples, spec.seq_len + 1), generator=gen)
            fixed[(local, shard)] = (t[:, :-1].contiguous(), t[:, 1:].contiguous())
        return fixed[(local, shard)]
    return batch


def origin_losses(workers) -> list[float]:
    origins = [w for w in workers.values() if w.seat.stage == 0]
    return [sum(w.ledger.history[i].loss_sum for w in origins) / sum(w.ledger.history[i].samples for w in origins)
            for i in range(len(origins[0].ledger.history))]


@pytest.mark.parametrize("share_dtype", ["float32", "int8"])
def test_delayed_updates_keep_replicas_identical_and_apply_every_update(share_dtype):
    workers = run(SPEC, share_dtype)
    for a, b in (("a0", "b0"), ("a1", "b1")):
        assert torch.equal(workers[a].seat.runner.parameter_vector(), workers[b].seat.runner.parameter_vector())
    for w in workers.values():
        # every share arrived, also those that came after the receiver moved on to the next iteration
        assert w.seat.runner.stepped_with[1] == 8 and not w.exchange.unanswered
        # the run's end flushed the last exchange: 4 iterations, 4 updates, none in flight
        assert w.seat.runner.step_count == SPEC.max_steps and w.exchange.pending is None
        assert w.seat.stepped_iteration == SPEC.max_steps - 1 and w.seat.pending_iteration is None


def test_delayed_updates_train_on_one_iteration_old_parameters():
    sync = run(m.RunSpec(**{**SPEC.__dict__, "gradient_exchange": "sync", "max_steps": 3}), "float32")
    delayed = run(m.RunSpec(**{**SPEC.__dict__, "max_steps": 3}), "float32")
    # iteration 0 (an epoch's first) is synchronous and iteration 1 trains on update 0 in both
    # modes; iteration 2 trains on update 0 only when delayed (update 1 is still in flight)
    s, d = origin_losses(sync), origin_losses(delayed)
    assert s[:2] == d[:2] and s[2] != d[2]
    assert not torch.equal(sync["a1"].seat.runner.parameter_vector(), delayed["a1"].seat.runner.parameter_vector())


def test_delayed_updates_lower_the_loss_a_few_iterations_behind_the_synchronous_exchange():
    spec = m.RunSpec(**{**SPEC.__dict__, "max_steps": 20})
    sync = origin_losses(run(m.RunSpec(**{**spec.__dict__, "gradient_exchange": "sync"}), batch=same_batches(spec)))
    delayed = origin_losses(run(spec, batch=same_batches(spec)))
    assert delayed[-1] < 0.6 * delayed[0]                  # it learns (the same tokens every iteration) ...
    # ... behind the synchronous exchange (one update later, on one-iteration-old parameters:
    # 2.96 against 1.91 after 20 iterations when measured), but not by more than 8 iterations
    assert sync[-1] < delayed[-1] < sync[-9]


def test_a_replica_that_copies_a_state_mid_epoch_takes_part_in_the_update_in_flight():
    # catch-up under delayed updates: the donor trained iteration 4 and its average is still in
    # flight (StateReply.pending = 4); the joiner copies the donor's state, takes part in that
    # update with a zero share (GradientExchange.take_on), and both apply the same update
    from types import SimpleNamespace
    from peer.compute.runner import StageRunner
    from peer.compute.state_transfer import flat_state, load_flat_state
    from peer.pipeline.averaging import GradientExchange
    from peer.pipeline.flights import IterationOutcome
    from peer.pipeline.ledger import Ledger
    from peer.pipeline.seat import StageSeat
    from peer.pipeline.settings import WorkerSettings
    from peer.pipeline.share_codec import decode_share
    from peer.routing.health import Health
    schedule = make_schedule("t", {"o": 0, "d": 1, "j": 1}, {0: ["o", "d"]})
    exchanges = {}

    class Wire:                      # the sender: a share lands in the replica's box
        health, tasks = Health(), SimpleNamespace(spawn=asyncio.ensure_future)

        def __init__(self, me):
            self.me = me

        async def send_with_retries(self, peer, share, what):
            n = exchanges[peer].seat.runner.num_parameters()
            await exchanges[peer].shares.add(self.me, share, decode_share(share.tensor, share.scales, n))
            return True

    async def go():
        for peer in ("d", "j"):
            seat = StageSeat(lambda s: StageRunner.from_spec(SPEC, s))
            await seat.take(1)
            exchanges[peer] = GradientExchange(peer, "t", WorkerSettings(), seat, Ledger(), Wire(peer), delayed=True)
        d, j = exchanges["d"], exchanges["j"]
        r = d.seat.runner
        Wire.health.departed.add("j")    # j was away: the donor averages iteration 3 without it
        for i in (3, 4):             # the donor trains two iterations: update 3 applied, 4 in flight
            x = torch.randn(2, 16, r.module.config.dim, generator=torch.Generator().manual_seed(i))
            out = await d.seat.compute(r.forward, (i, 0), x)
            await d.seat.compute(r.backward, (i, 0), torch.ones_like(out))
            await d.average_and_step(i, schedule, IterationOutcome(i, 1, 1))
        assert d.seat.pending_iteration == 4 and d.seat.trains_iteration() == 5
        Wire.health.departed.discard("j")    # back, caught up: it copies the donor's state
        await j.seat.compute(load_flat_state, j.seat.runner, *await d.seat.compute(flat_state, r))
        j.take_on(4, schedule)
        await asyncio.gather(d.flush(), j.flush())
        return d, j
    d, j = asyncio.run(asyncio.wait_for(go(), 60))
    assert torch.equal(d.seat.runner.parameter_vector(), j.seat.runner.parameter_vector())
    assert d.seat.stepped_iteration == j.seat.stepped_iteration == 4 and not d.unanswered and not j.unanswered
