"""Replica averaging (peer/pipeline/averaging.py): shares are collected without waiting for the
acks of our own, a refused share ends the wait for that replica at once, and a leaving peer
flushes its last shares; the share dtypes on the wire (peer/pipeline/share_codec.py)."""
import asyncio

import pytest
import torch

from peer.pipeline.averaging import Contribution, ShareBox, ShareDeliveries, combine
from protocol.messages import GradientShare
from protocol.tensors import TensorPayload


def share(iteration=0, samples=2) -> GradientShare:
    return GradientShare("run", 1, iteration, 1, samples, TensorPayload("float32", (1,), b"\0" * 4))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_collect_does_not_wait_for_our_own_acks_and_flush_does():
    async def main():
        box, release, sent = ShareBox(), asyncio.Event(), []

        async def slow_send(peer, s):   # the ack from "b" never comes until released
            sent.append(peer)
            await release.wait()
            return True
        deliveries = ShareDeliveries(slow_send, box)
        out = deliveries.start(["b"], share())
        await box.add("b", share(samples=3), torch.ones(1))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await box.collect(0, 1, {"b"}, timeout=5.0, gone=lambda p: out.gone(p, False))
        assert loop.time() - t0 < 0.5 and set(got) == {"b"}
        assert deliveries.pending == 1                     # still on its way
        await deliveries.flush(timeout=0.2)                # not delivered yet: flush gives up in time
        assert deliveries.pending == 1 and sent == ["b"]
        release.set()
        await deliveries.flush(timeout=5.0)
        assert deliveries.pending == 0 and out.state == {"b": "delivered"}
    run(main())


def test_a_refused_share_ends_the_wait_for_that_replica_at_once():
    async def main():
        box = ShareBox()

        async def send(peer, s):
            return peer != "c"                             # "c" sits out a partition
        deliveries = ShareDeliveries(send, box)
        out = deliveries.start(["b", "c"], share())
        await box.add("b", share(), torch.ones(1))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # a recheck period far beyond the test's timeout: only the wake-up can end the wait
        got = await box.collect(0, 1, {"b", "c"}, timeout=30.0, gone=lambda p: out.gone(p, False), recheck_s=30.0)
        assert loop.time() - t0 < 1.0
        assert set(got) == {"b"} and out.state == {"b": "delivered", "c": "refused"}
    run(main())


def test_a_suspect_replica_is_waited_for_while_our_share_to_it_is_on_its_way():
    async def main():
        box, answer = ShareBox(), asyncio.Event()
        result = {"b": True, "c": False}

        async def send(peer, s):
            await answer.wait()
            return result[peer]
        out = ShareDeliveries(send, box).start(["b", "c"], share())
        # both look dead, but our shares are still pending: their outcome decides, not the suspicion
        assert not out.gone("b", suspect=True) and not out.gone("c", suspect=True)
        answer.set()
        await asyncio.sleep(0.01)
        assert not out.gone("b", suspect=False) and out.gone("b", suspect=True)   # took ours, then died
        assert out.gone("c", suspect=False)                                         # refused ours
    run(main())


def test_a_failing_send_counts_as_refused():
    async def main():
        box = ShareBox()

        async def broken(peer, s):
            raise RuntimeError("bug")
        deliveries = ShareDeliveries(broken, box)
        out = deliveries.start(["b"], share())
        await deliveries.flush(timeout=5.0)
        assert out.state == {"b": "refused"}
    run(main())


def test_cancel_stops_pending_deliveries():
    async def main():
        box, never = ShareBox(), asyncio.Event()

        async def send(peer, s):
            await never.wait()
            return True
        deliveries = ShareDeliveries(send, box)
        deliveries.start(["b", "c"], share())
        await asyncio.sleep(0)
        deliveries.cancel()
        await asyncio.sleep(0.01)
        assert deliveries.pending == 0
    run(main())


def test_combine_is_the_same_sum_in_any_arrival_order():
    torch.manual_seed(0)
    parts = {p: Contribution(torch.randn(1000) * 1e3, n, float(n)) for n, p in enumerate("dcab", 1)}
    forward = combine(dict(parts), ["a", "b", "c", "d"])
    backward = combine(dict(reversed(list(parts.items()))), ["a", "b", "c", "d"])
    assert torch.equal(forward.vector, backward.vector)
    assert forward.samples == 10 and forward.missing == () and forward.peers == ("a", "b", "c", "d")
    partial = combine({p: parts[p] for p in "ab"}, ["a", "b", "c"])
    assert partial.missing == ("c",) and partial.samples == parts["a"].samples + parts["b"].samples
    assert torch.allclose(partial.vector, parts["a"].vector + parts["b"].vector)


def _pair(encoded):
    payload, scales, vector = encoded
    assert scales is None
    return payload, vector


def test_float16_shares_halve_the_bytes_and_every_replica_adds_what_travelled():
    from peer.compute import tensor_codec
    from peer.pipeline.share_codec import encode_share
    torch.manual_seed(0)
    vectors = {p: torch.randn(1000) * 1e-2 for p in ("a", "b", "c")}
    exact = {p: _pair(encode_share(v, "float32")) for p, v in vectors.items()}
    half = {p: _pair(encode_share(v, "float16")) for p, v in vectors.items()}
    assert all(len(half[p][0].data) * 2 == len(exact[p][0].data) for p in vectors)
    assert all(torch.equal(exact[p][1], vectors[p]) for p in vectors)        # float32: our exact vector
    # what each replica adds for itself is what the others decode from its share...
    sums = []
    for me in vectors:
        contributions = {p: Contribution(half[p][1] if p == me else
                                         tensor_codec.decode(half[p][0], cast_to=torch.float32), 1)
                         for p in vectors}
        sums.append(combine(contributions, list(vectors)).vector)
    assert all(torch.equal(s, sums[0]) for s in sums)                       # ...so all stay identical
    assert torch.allclose(sums[0], sum(vectors.values()), rtol=0, atol=1e-4)  # and close to the exact sum
    assert not torch.equal(half["a"][1], vectors["a"])                       # (it was rounded)


def test_a_vector_float16_cannot_hold_travels_as_float32():
    from peer.pipeline.share_codec import encode_share
    v = torch.tensor([1.0, 1e6, -3.0])
    payload, scales, vector = encode_share(v, "float16")
    assert payload.dtype == "float32" and scales is None and torch.equal(vector, v)


def test_int8_shares_quarter_the_bytes_keep_each_blocks_range_and_replicas_identical():
    from peer.pipeline.share_codec import block_count, decode_share, encode_share
    from protocol.messages import SHARE_BLOCK
    torch.manual_seed(1)
    n = 5 * SHARE_BLOCK + 7                                  # a partial last block
    vectors = {p: torch.randn(n) * 1e-3 for p in ("a", "b", "c")}
    vectors["a"][3] = 5.0                                    # one huge gradient in block 0
    shares = {p: encode_share(v, "int8") for p, v in vectors.items()}
    payload, scales, mine = shares["a"]
    assert payload.dtype == "int8" and len(payload.data) == n
    assert scales.dtype == "float32" and scales.shape == (block_count(n),)
    error = (mine - vectors["a"]).abs()
    # within half a quantisation step of its own block: the huge value costs only block 0
    assert error[:SHARE_BLOCK].max() <= 5.0 / 127 / 2 + 1e-6
    assert error[SHARE_BLOCK:].max() <= vectors["a"][SHARE_BLOCK:].abs().max() / 127 / 2 + 1e-9
    assert error[SHARE_BLOCK:].max() < 1e-4                  # not 5.0 / 254
    sums = []
    for me in vectors:
        contributions = {p: Contribution(shares[p][2] if p == me else decode_share(shares[p][0], shares[p][1], n), 1)
                         for p in vectors}
        sums.append(combine(contributions, list(vectors)).vector)
    assert all(torch.equal(s, sums[0]) for s in sums)


def test_int8_of_an_all_zero_block_and_a_non_finite_vector():
    from peer.pipeline.share_codec import decode_share, encode_share
    payload, scales, vector = encode_share(torch.zeros(100), "int8")
    assert torch.equal(vector, torch.zeros(100)) and torch.equal(decode_share(payload, scales, 100), vector)
    bad = torch.tensor([1.0, float("nan"), 2.0])
    payload, scales, vector = encode_share(bad, "int8")      # travels as float32; the receiver rejects it
    assert payload.dtype == "float32" and scales is None


@pytest.mark.parametrize("case", ["no scales", "scales on float16", "wrong scale count", "negative scale",
                                  "nan scale", "wrong length", "int32 values"])
def test_decode_share_rejects_malformed_shares(case):
    from peer.compute import tensor_codec
    from peer.compute.errors import BadTensor
    from peer.pipeline.share_codec import decode_share, encode_share
    payload, scales, _ = encode_share(torch.randn(130), "int8")
    half, _, _ = encode_share(torch.randn(130), "float16")
    args = {"no scales": (payload, None, 130),
            "scales on float16": (half, scales, 130),
            "wrong scale count": (payload, tensor_codec.encode(torch.ones(2)), 130),
            "negative scale": (payload, tensor_codec.encode(torch.tensor([1.0, -1.0, 1.0])), 130),
            "nan scale": (payload, tensor_codec.encode(torch.tensor([1.0, float("nan"), 1.0])), 130),
            "wrong length": (payload, scales, 131),
            "int32 values": (tensor_codec.encode(torch.zeros(130, dtype=torch.int32)), scales, 130)}[case]
    with pytest.raises(BadTensor):
        decode_share(*args)
