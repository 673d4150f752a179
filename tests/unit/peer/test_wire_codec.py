"""Quantised activations and gradients (protocol 1.6) in the peer: the torch codec's round trip and
error bound, the sender's negotiation and per-link choice, error feedback, the receiver's refusal of
malformed payloads, and floats unchanged when compression is off."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from peer.compute import tensor_codec
from peer.compute.errors import BadTensor
from peer.compute.quantise import dequantise, quantise
from peer.pipeline import wire
from protocol import codec
from protocol import messages as m
from protocol.errors import ProtocolError
from protocol.quantised import QMAX, Quantised
from protocol.schedule import LinkCodec
from protocol.tensors import TensorPayload
from tests.unit.protocol.codec_support import FAST, SAMPLES

HEADER = m.WorkHeader("run-1", 1, 0, 3, 1)
SCHED = SAMPLES[3]


@FAST
@given(st.sampled_from(["int8", "int4"]), st.sampled_from([8, 64, 96]),
       st.lists(st.integers(0, 7), min_size=1, max_size=3), st.integers(0, 2**31))
def test_round_trip_is_what_the_sender_predicts_and_within_half_a_step(codec_, block, shape, seed):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3
    header, payload, restored = quantise(x, codec_, block)
    out = dequantise(header, payload)
    assert torch.equal(out, restored) and out.shape == x.shape
    flat, err = x.reshape(-1), (out - x).abs().reshape(-1)
    for b in range(0, flat.numel(), block):
        step = flat[b:b + block].abs().max() / QMAX[codec_]
        assert float(err[b:b + block].max()) <= float(step) / 2 * (1 + 1e-5) + 1e-12


@FAST
@given(st.sampled_from(["int8", "int4"]), st.sampled_from([8, 64, 96]),
       st.lists(st.integers(0, 7), min_size=1, max_size=3), st.integers(0, 2**31), st.floats(-5, 5))
def test_min_max_blocks_decode_as_predicted_within_half_a_step(codec_, block, shape, seed, shift):
    from protocol.quantised import LEVELS
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3 + shift
    header, payload, restored = quantise(x, codec_, block, offsets=True)
    out = dequantise(header, payload)
    assert header.offsets and torch.equal(out, restored) and out.shape == x.shape
    flat, err = x.reshape(-1), (out - x).abs().reshape(-1)
    for b in range(0, flat.numel(), block):
        part = flat[b:b + block]
        step = (part.max() - part.min()) / LEVELS[codec_]
        assert float(err[b:b + block].max()) <= float(step) / 2 * (1 + 1e-4) + 1e-5 * float(part.abs().max())


def test_min_max_int4_errs_less_than_absmax_on_activations():
    torch.manual_seed(0)
    x = torch.randn(4, 64, 64) + torch.randn(4, 64, 1)      # per-token offsets, as a residual stream has
    errors = [float((quantise(x, "int4", offsets=o)[2] - x).norm() / x.norm()) for o in (False, True)]
    assert errors[1] < 0.8 * errors[0]


def test_int4_activations_go_min_max_only_to_receivers_that_read_it():
    x = torch.randn(2, 64)
    fwd = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    back = m.BackwardRequest(HEADER, tensor_codec.encode(x))
    w = wire.WireCompression("int4", {"new": (1, 11), "older": (1, 10)}, "a")
    assert w.compress(fwd, x, SCHED, "new").quantised.offsets
    assert not w.compress(fwd, x, SCHED, "older").quantised.offsets        # it would drop the field
    assert not w.compress(back, x, SCHED, "new").quantised.offsets         # gradients: absmax, stochastic
    assert not wire.WireCompression("int8", {"new": (1, 11)}, "a").compress(fwd, x, SCHED, "new").quantised.offsets
    sent = codec.decode(codec.encode(w.compress(fwd, x, SCHED, "new")))
    assert sent.quantised.offsets
    assert torch.allclose(wire.decode(wire.received(sent), (2, 64), "t"), x, atol=0.5)


@FAST
@given(st.sampled_from(["int8", "int4"]), st.sampled_from([8, 64]), st.booleans(),
       st.lists(st.integers(1, 9), min_size=2, max_size=3), st.integers(0, 2**31))
def test_channel_blocks_round_trip_and_each_channel_block_keeps_its_own_range(codec_, block, offsets, shape, seed):
    from protocol.quantised import LEVELS, QMAX
    from peer.compute.quantise import channel_major
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.rand(shape[-1], generator=g) * 4 + torch.randn(shape[-1], generator=g)
    header, payload, restored = quantise(x, codec_, block, offsets=offsets, channels=True)
    out = dequantise(header, payload)
    assert header.channels and torch.equal(out, restored) and out.shape == x.shape
    # the error bound holds per block of the channel-major sequence (the tail block padded as sent)
    flat, err = channel_major(x), channel_major((out - x).abs())
    for b in range(0, flat.numel(), block):
        part = flat[b:b + block]
        step = (part.max() - part.min()) / LEVELS[codec_] if offsets else part.abs().max() / QMAX[codec_]
        assert float(err[b:b + block].max()) <= float(step) / 2 * (1 + 1e-4) + 1e-5 * float(part.abs().max())


def test_channel_blocks_err_less_on_a_residual_stream_and_travel_only_to_receivers_that_read_them():
    torch.manual_seed(0)
    # channels with their own offset and spread, as a trained residual stream has (codec_study: 0.7 std off
    # zero, spreads over 3x apart)
    x = (torch.randn(4, 64, 64) * (0.5 + 2 * torch.rand(64)) + 1.5 * torch.randn(64))
    errors = [float((quantise(x, "int4", offsets=True, channels=c)[2] - x).norm() / x.norm()) for c in (False, True)]
    assert errors[1] < 0.7 * errors[0]
    fwd = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    back = m.BackwardRequest(HEADER, tensor_codec.encode(x))
    w = wire.WireCompression("int4", {"new": (1, 12), "older": (1, 11)}, "a")
    assert w.compress(fwd, x, SCHED, "new").quantised.channels
    assert w.compress(back, x, SCHED, "new").quantised.channels               # one rule both ways
    assert not w.compress(fwd, x, SCHED, "older").quantised.channels          # it would drop the field
    flat = torch.randn(64)
    assert not w.compress(m.ForwardRequest(HEADER, tensor_codec.encode(flat)), flat, SCHED, "new").quantised.channels
    sent = codec.decode(codec.encode(w.compress(fwd, x, SCHED, "new")))
    assert sent.quantised.channels and wire.has_channels(wire.received(sent))
    decoded = wire.decode(wire.received(sent), tuple(x.shape), "t")
    assert float((decoded - x).norm() / x.norm()) == pytest.approx(errors[1], rel=1e-4)


def test_the_layout_a_sender_owes_follows_its_version():
    rows = Quantised("int4", 64, (2, 8, 64), offsets=True)
    absmax = Quantised("int4", 64, (2, 8, 64), channels=True)
    both = Quantised("int4", 64, (2, 8, 64), offsets=True, channels=True)
    assert wire.layout_owed(rows, (1, 12), True) == "channel blocks" and wire.layout_owed(rows, (1, 11), True) is None
    assert wire.layout_owed(absmax, (1, 12), True) == "min/max blocks"
    assert wire.layout_owed(absmax, (1, 12), False) is None                 # gradients go absmax
    assert wire.layout_owed(both, (1, 12), True) is None and wire.layout_owed(rows, None, True) is None
    assert wire.layout_owed(Quantised("int8", 64, (64,)), (1, 12), True) is None   # one dimension: no channels


def test_compression_ratio_and_error_on_activations():
    torch.manual_seed(0)
    x = torch.randn(4, 64, 256)
    for codec_, ratio, rel in (("int8", 3.7, 0.01), ("int4", 7.0, 0.15)):
        _, payload, restored = quantise(x, codec_)
        assert x.numel() * 4 / payload.nbytes > ratio
        assert float((restored - x).norm() / x.norm()) < rel


def test_non_finite_tensors_travel_as_floats():
    assert quantise(torch.tensor([1.0, math.nan]), "int8") is None
    w = wire.WireCompression("int8", {"b": (1, 6)}, "a")
    req = m.BackwardRequest(HEADER, tensor_codec.encode(torch.tensor([math.inf] * 4)))
    assert w.compress(req, torch.tensor([math.inf] * 4), SCHED, "b") is req


@FAST
@given(st.binary(max_size=400), st.sampled_from(["int8", "int4"]), st.integers(8, 64))
def test_random_payloads_decode_or_raise_bad_tensor(data, codec_, block):
    h = Quantised(codec_, block, (len(data) // 2,))
    try:
        out = wire.decode(wire.Packed(h, TensorPayload("uint8", (len(data),), data)), h.shape, "x")
    except BadTensor:
        return
    assert out.shape == h.shape and out.dtype == torch.float32


@FAST
@given(st.integers(0, 10**6), st.integers(0, 255))
def test_mutated_quantised_frames_raise_only_protocol_errors_or_bad_tensor(pos, value):
    x = torch.randn(2, 40)
    h, payload, _ = quantise(x, "int4", 16)
    frame = bytearray(codec.encode(m.ForwardRequest(HEADER, payload, h)))
    frame[pos % len(frame)] = value
    try:
        req = codec.decode(bytes(frame), expected=m.ForwardRequest)
        wire.decode(wire.received(req), (2, 40), "forward tensor")
    except (ProtocolError, BadTensor):
        pass


def test_negotiation_older_or_unknown_receivers_get_floats():
    x = torch.randn(2, 64)
    req = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    versions = {"old": (1, 5), "new": (1, 6)}
    w = wire.WireCompression("int8", versions, "a")
    assert w.compress(req, x, SCHED, "old") is req
    assert w.compress(req, x, SCHED, "stranger") is req
    sent = w.compress(req, x, SCHED, "new")
    assert sent.quantised.codec == "int8" and sent.tensor.dtype == "uint8"
    back = codec.decode(codec.encode(sent))
    assert torch.allclose(wire.decode(wire.received(back), (2, 64), "t"), x, atol=0.05)


def test_auto_follows_the_schedule_per_link():
    import dataclasses
    x = torch.randn(2, 64)
    req = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    sched = dataclasses.replace(SCHED, wire=(LinkCodec("a", "b", "int4"),))
    w = wire.WireCompression("auto", {"b": (1, 6), "c": (1, 6)}, "a")
    assert w.compress(req, x, sched, "b").quantised.codec == "int4"
    assert w.compress(req, x, sched, "c") is req                 # not listed: floats
    assert wire.WireCompression("off", {"b": (1, 6)}, "a").compress(req, x, sched, "b") is req


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_floats_are_bit_for_bit_when_off(dtype):
    x = torch.randn(2, 3, 8).to(dtype)
    req = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    assert wire.WireCompression("auto", {"b": (1, 6)}, "a").compress(req, x, SCHED, "b") is req
    got = wire.decode(wire.received(codec.decode(codec.encode(req))), (2, 3, 8), "t")
    before = tensor_codec.decode(req.tensor, expect_shape=(2, 3, 8), cast_to=torch.float32)
    assert torch.equal(got, before) and torch.equal(got, x.to(torch.float32))


def test_shape_mismatch_is_a_bad_tensor():
    h, payload, _ = quantise(torch.randn(2, 64), "int8")
    with pytest.raises(BadTensor):
        wire.decode(wire.Packed(h, payload), (2, 32), "t")


@pytest.mark.parametrize("rounding", ["feedback", "stochastic", "nearest"])
def test_error_feedback_or_stochastic_rounding_keeps_the_delivered_sum_on_track(rounding):
    g = torch.full((64,), 0.003)
    g[0] = 1.0                     # int4 step 1/7: alone, 0.003 rounds to 0 every time
    w = wire.WireCompression("int4", {"b": (1, 6)}, "a", error_feedback=rounding == "feedback",
                             stochastic_gradients=rounding == "stochastic", seed=0)
    total = torch.zeros(64)
    for _ in range(100):
        sent = w.compress(m.BackwardRequest(HEADER, tensor_codec.encode(g)), g, SCHED, "b")
        total += wire.decode(wire.received(sent), (64,), "g")
    drift = float((total[1:] - 100 * g[1:]).abs().max())
    if rounding == "feedback":
        assert drift <= 1.0 / 7 / 2 + 1e-4          # at most one residual behind
    elif rounding == "stochastic":
        # unbiased: 0.003 travels as 1/7 with probability 0.021, so the 63 small elements'
        # mean total is 0.3 give or take 0.025 (one standard deviation)
        assert abs(float(total[1:].mean()) - 0.3) < 0.1
        assert 0 < drift < 1.5                     # each element a random walk, not the whole 0.3 lost
    else:
        assert drift > 0.29                        # the whole 0.3 lost


def test_gradients_round_stochastically_and_activations_to_nearest_by_default():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    w = wire.WireCompression("int8", {"b": (1, 6)}, "a")
    fwd = [wire.decode(wire.received(w.compress(m.ForwardRequest(HEADER, tensor_codec.encode(x)), x, SCHED, "b")),
                       (4, 64), "t") for _ in range(2)]
    assert torch.equal(fwd[0], fwd[1]) and torch.equal(fwd[0], quantise(x, "int8")[2])
    back = [wire.decode(wire.received(w.compress(m.BackwardRequest(HEADER, tensor_codec.encode(x)), x, SCHED, "b")),
                        (4, 64), "t") for _ in range(2)]
    assert not torch.equal(back[0], back[1])         # a fresh draw each time
    step = x.abs().amax(dim=1, keepdim=True) / QMAX["int8"]
    assert bool(((back[0] - x).abs() < step * (1 + 1e-5)).all())    # within one step, not half


@pytest.mark.parametrize("codec_", ["int8", "int4"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stochastic_rounding_is_unbiased_and_decodes_as_the_sender_predicts(codec_, seed):
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(seed))
    draws = 400                      # one row per block: each row of x quantised 400 times at once
    header, payload, restored = quantise(x.repeat(draws, 1), codec_, 64, torch.Generator().manual_seed(seed))
    assert torch.equal(dequantise(header, payload), restored)
    step = x.abs().amax(dim=1, keepdim=True) / QMAX[codec_]
    mean = restored.view(draws, 2, 64).mean(0)
    # each element's mean of 400 draws is within 6 standard deviations (one is <= step / 2 / 20) of
    # x, and so is the mean error over all 128 (its deviation is sqrt(128) times smaller)
    assert bool(((mean - x).abs() <= step * 0.15 + 1e-7).all())
    assert abs(float((mean - x).mean())) <= float(step.max()) * 0.15 / 128 ** 0.5 + 1e-7
    nearest = quantise(x, codec_, 64)[2]
    assert not torch.equal(restored[:2], nearest) or not torch.equal(restored[2:4], nearest)   # draws vary


def test_bench_jitter_control_sends_floats_a_hair_off_and_restores_the_sender():
    from bench.support.wire_jitter import jitter, jittered_floats
    x = torch.randn(2, 64, 8)
    rel = float((jitter(x) - x).norm() / x.norm())
    assert 0 < rel < 1e-4
    original = wire.WireCompression.pack
    w = wire.WireCompression("int8", {"b": (1, 6)}, "a")
    req = m.ForwardRequest(HEADER, tensor_codec.encode(x))
    with jittered_floats():
        sent = w.compress(req, x, SCHED, "b")
        assert sent.quantised is None and sent.tensor.dtype == "float32"
        assert torch.equal(wire.decode(wire.received(sent), tuple(x.shape), "t"), jitter(x))
        assert w.compress(req, x, SCHED, "stranger") is req          # a link that would carry floats anyway
    assert wire.WireCompression.pack is original
