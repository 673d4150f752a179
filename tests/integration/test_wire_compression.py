"""Compressed activations and gradients in the in-memory swarm (issue 27): with compression off
the floats are bit-for-bit what they were; int8 and int4 links train close to floats."""
import asyncio
import dataclasses

import pytest
import torch

from protocol import messages as m
from protocol.schedule import LinkCodec

from bench.support.memory_swarm import batches_for, make_schedule, run_memory_swarm

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=7,
                 microbatch_samples=2, seq_len=16, microbatches_per_origin=4, max_steps=2,
                 learning_rate=1e-3, warmup_steps=1)
STAGE_OF = {"p0": 0, "p1": 1, "p2": 2}
PATHS = {mb: ["p0", "p1", "p2"] for mb in range(4)}


def every_link(codec: str) -> tuple[LinkCodec, ...]:
    peers = list(STAGE_OF)
    return tuple(LinkCodec(a, b, codec) for a in peers for b in peers if a != b)


def run(wire=(), mode="auto"):
    schedule = dataclasses.replace(make_schedule("t", STAGE_OF, PATHS), wire=wire)
    batch, _ = batches_for(SPEC)
    return asyncio.run(run_memory_swarm(SPEC, schedule, batch, wire_compression=mode))


def results(workers):
    losses = [o.loss_sum for o in workers["p0"].ledger.history]
    grads = {p: w.seat.runner.stepped_with[0] for p, w in workers.items()}
    sent = {p: dict(w.sender.wire.sent) for p, w in workers.items()}
    return losses, grads, sent


def test_off_sends_the_same_floats_whatever_the_schedule_says():
    plain_losses, plain_grads, plain_sent = results(run())
    off_losses, off_grads, off_sent = results(run(every_link("int4"), mode="off"))
    assert off_losses == plain_losses
    assert all(torch.equal(off_grads[p], plain_grads[p]) for p in STAGE_OF)
    assert all(s["int8"] == s["int4"] == 0 and s["off"] > 0 for s in (*off_sent.values(), *plain_sent.values()))


@pytest.mark.parametrize("codec,loss_tol,grad_cos", [("int8", 0.01, 0.99), ("int4", 0.05, 0.8)])
def test_quantised_links_train_close_to_floats(codec, loss_tol, grad_cos):
    plain_losses, plain_grads, _ = results(run())
    losses, grads, sent = results(run(every_link(codec)))
    # the first request to each peer goes as floats (its version is not known yet), the rest quantised
    assert sum(s[codec] for s in sent.values()) >= 10 and all(s["off"] <= 2 for s in sent.values())
    for got, want in zip(losses, plain_losses):
        assert abs(got - want) <= loss_tol * abs(want)
    for p in STAGE_OF:
        cos = torch.nn.functional.cosine_similarity(grads[p], plain_grads[p], dim=0)
        assert cos > grad_cos, (p, float(cos))
    assert losses != plain_losses          # it did change what travelled
