"""A peer answers bad requests with specific errors and keeps its state clean (issue 4/7)."""
import asyncio
import struct

import pytest
import torch

from protocol import codec
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.quantised import Quantised
from protocol.tensors import TensorPayload

from peer.compute import tensor_codec
from peer.compute.quantise import dequantise, quantise
from peer.compute.runner import StageRunner
from peer.pipeline.handlers import WorkHandlers
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.worker import PipelineWorker, StageSeat, WorkerSettings
from peer.transport.memory import MemoryNetwork
from peer.transport.rpc import RemoteError, RpcClient, RpcServer
from bench.support.memory_swarm import make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, microbatch_samples=2, seq_len=8)
SCHEDULE = make_schedule("t", {"p0": 0, "p1": 1}, {0: ["p0", "p1"]}, epoch=3)


def serve_p1(schedule):
    """Peer p1 hosting stage 1 under `schedule`, serving the real handlers in memory."""
    network = MemoryNetwork()
    book = ScheduleBook()
    book.add(schedule)
    worker = PipelineWorker("p1", SPEC, RpcClient(network.transport("p1")), book,
                            StageSeat(lambda s: StageRunner.from_spec(SPEC, s)),
                            settings=WorkerSettings())
    worker.seat.runner, worker.seat.stage = StageRunner.from_spec(SPEC, 1), 1
    server = RpcServer()

    async def no_refresh():
        return None
    WorkHandlers(worker, no_refresh).register(server)
    asyncio.run(network.transport("p1").serve(server.handle))
    return network, worker


@pytest.fixture
def setup():
    return serve_p1(SCHEDULE)


def activation(shape=(2, 8, 64), fill=None):
    t = torch.randn(shape)
    if fill is not None:
        t[0, 0, 0] = fill
    return tensor_codec.encode(t)


def quantised(codec_="int8", shape=(2, 8, 64), scales=None, cut=0, header_shape=None):
    """A quantised activation (protocol 1.6), optionally broken: scales replaced, bytes cut off,
    or a header that claims another shape."""
    q, payload, _ = quantise(torch.randn(shape), codec_)
    data = bytearray(payload.data)
    if scales is not None:
        data[:4 * len(scales)] = struct.pack(f"<{len(scales)}f", *scales)
    if cut:
        data = data[:-cut]
    if header_shape is not None:
        q = Quantised(q.codec, q.block, header_shape)
    return m.ForwardRequest(header(), TensorPayload("uint8", (len(data),), bytes(data)), q)


def call(network, sender, message):
    return asyncio.run(RpcClient(network.transport(sender)).call("p1", message, 5.0))


def header(**kw):
    base = dict(run="t", epoch=3, iteration=0, microbatch_id=0, hop_index=1)
    return m.WorkHeader(**{**base, **kw})


def expect_error(network, message, code, sender="p0"):
    with pytest.raises(RemoteError) as info:
        call(network, sender, message)
    assert info.value.code == code, info.value
    return info.value


def test_valid_forward_is_queued(setup):
    network, worker = setup
    reply = call(network, "p0", m.ForwardRequest(header(), activation()))
    assert isinstance(reply, m.ForwardReply) and len(worker.inbox) == 1


@pytest.mark.parametrize("message,code", [
    (m.ForwardRequest(header(), activation((2, 8, 32))), ErrorCode.BAD_TENSOR),
    (m.ForwardRequest(header(), tensor_codec.encode(torch.zeros(2, 8, 64, dtype=torch.int64))), ErrorCode.BAD_TENSOR),
    (m.ForwardRequest(header(), activation(fill=float("nan"))), ErrorCode.NON_FINITE),
    (m.ForwardRequest(header(), activation(fill=float("inf"))), ErrorCode.NON_FINITE),
    (m.ForwardRequest(header(run="other"), activation()), ErrorCode.UNKNOWN_RUN),
    (m.ForwardRequest(header(epoch=2), activation()), ErrorCode.STALE_SCHEDULE),
    (m.ForwardRequest(header(iteration=9), activation()), ErrorCode.OVERLOADED),
    (m.ForwardRequest(header(microbatch_id=5), activation()), ErrorCode.UNKNOWN_MICROBATCH),
    (m.ForwardRequest(header(hop_index=0), activation()), ErrorCode.WRONG_STAGE),
    # quantised tensors (protocol 1.6) get the same checks: length, scales, shape
    (quantised(cut=1), ErrorCode.BAD_TENSOR),
    (quantised("int4", cut=3), ErrorCode.BAD_TENSOR),
    (quantised(scales=[float("nan")]), ErrorCode.BAD_TENSOR),
    (quantised("int4", scales=[1.0, float("inf")]), ErrorCode.BAD_TENSOR),
    (quantised(scales=[-1.0]), ErrorCode.BAD_TENSOR),
    (quantised(header_shape=(2, 8, 32)), ErrorCode.BAD_TENSOR),
    (quantised(shape=(2, 8, 32), header_shape=(2, 8, 32)), ErrorCode.BAD_TENSOR),
])
def test_bad_requests_get_specific_errors_and_leave_no_trace(setup, message, code):
    network, worker = setup
    expect_error(network, message, code)
    assert len(worker.inbox) == 0 and worker.seat.runner.stashed == 0


@pytest.mark.parametrize("codec_", ["int8", "int4"])
def test_a_valid_quantised_forward_is_queued_as_float32(setup, codec_):
    network, worker = setup
    request = quantised(codec_)
    reply = call(network, "p0", request)
    assert isinstance(reply, m.ForwardReply) and len(worker.inbox) == 1
    work = next(iter(worker.inbox._items.values()))
    expected = dequantise(request.quantised, request.tensor)
    assert work.tensor.dtype == torch.float32 and torch.equal(work.tensor, expected)


@pytest.mark.parametrize("sender_version,offsets,channels,refused", [
    ((1, 12), True, False, True),      # a 1.12 member sending token blocks: a coarser spot-check allowance
    ((1, 12), False, True, True),      # ... or absmax int4 going forward (min/max since 1.11)
    ((1, 12), True, True, False),
    ((1, 11), True, False, False),     # a 1.11 peer does not know channel blocks
    ((1, 11), False, False, True),
    (None, False, False, False),       # not heard from yet: no telling what it sends
])
def test_a_member_must_send_the_layout_its_version_uses(setup, sender_version, offsets, channels, refused):
    network, worker = setup
    if sender_version is not None:
        worker.sender.wire.versions["p0"] = sender_version
    x = torch.randn(2, 8, 64) * torch.rand(64) * 3 + torch.randn(64)
    q, payload, restored = quantise(x, "int4", offsets=offsets, channels=channels)
    request = m.ForwardRequest(header(), payload, q)
    if refused:
        error = expect_error(network, request, ErrorCode.BAD_TENSOR)
        assert "sends" in str(error) and len(worker.inbox) == 0
    else:
        assert isinstance(call(network, "p0", request), m.ForwardReply)
        assert torch.equal(next(iter(worker.inbox._items.values())).tensor, restored)


def test_a_stranger_cannot_inject_activations(setup):
    network, worker = setup
    expect_error(network, m.ForwardRequest(header(), activation()), ErrorCode.NOT_MEMBER, sender="mallory")
    assert len(worker.inbox) == 0


def test_malformed_frames_get_error_replies(setup):
    network, _ = setup
    transport = network.transport("p0")
    garbage = asyncio.run(transport.request("p1", [b"\xc1garbage"], 5.0))
    assert codec.decode(garbage).code == ErrorCode.MALFORMED
    import msgpack
    future = msgpack.packb({"v": [9, 0], "t": 10, "b": {}})
    reply = codec.decode(asyncio.run(transport.request("p1", [future], 5.0)))
    assert reply.code == ErrorCode.VERSION_MISMATCH and "v9.0" in reply.message


def test_worker_still_serves_after_bad_input(setup):
    network, worker = setup
    for _ in range(20):
        expect_error(network, m.ForwardRequest(header(), activation(fill=float("nan"))), ErrorCode.NON_FINITE)
    assert isinstance(call(network, "p0", m.ForwardRequest(header(), activation())), m.ForwardReply)


def test_gradient_shares_arrive_as_float32_from_float16_and_other_dtypes_are_refused():
    network, worker = serve_p1(make_schedule("t", {"p0": 0, "p1": 1, "p2": 1}, {0: ["p0", "p1"]}, epoch=3))
    n = worker.seat.runner.num_parameters()
    sent = torch.randn(n)

    def share(dtype):
        return m.GradientShare("t", 3, 0, 1, 4, tensor_codec.encode(sent.to(dtype)))
    assert isinstance(call(network, "p2", share(torch.float16)), m.GradientShareAck)
    got = asyncio.run(worker.exchange.shares.collect(0, 1, {"p2"}, timeout=1.0))
    assert got["p2"].vector.dtype == torch.float32 and torch.equal(got["p2"].vector, sent.half().float())
    expect_error(network, share(torch.bfloat16), ErrorCode.BAD_TENSOR, sender="p2")
    # a finite share claiming 2**64 - 1 samples (the red team's crash): refused, the peer serves on
    huge = m.GradientShare("t", 3, 0, 1, 2**64 - 1, tensor_codec.encode(sent.to(torch.float16)))
    expect_error(network, huge, ErrorCode.MALFORMED, sender="p2")
    assert isinstance(call(network, "p2", share(torch.float16)), m.GradientShareAck)


def test_int8_shares_arrive_dequantised_and_malformed_ones_are_refused():
    from peer.pipeline.share_codec import encode_share
    network, worker = serve_p1(make_schedule("t", {"p0": 0, "p1": 1, "p2": 1}, {0: ["p0", "p1"]}, epoch=3))
    n = worker.seat.runner.num_parameters()
    payload, scales, decoded = encode_share(torch.randn(n) * 1e-3, "int8")

    def share(scales_payload, iteration=0):
        return m.GradientShare("t", 3, iteration, 1, 4, payload, 0.0, scales_payload)
    assert isinstance(call(network, "p2", share(scales)), m.GradientShareAck)
    got = asyncio.run(worker.exchange.shares.collect(0, 1, {"p2"}, timeout=1.0))
    assert torch.equal(got["p2"].vector, decoded)               # what the sender adds for itself
    expect_error(network, share(None, 1), ErrorCode.BAD_TENSOR, sender="p2")
    inf_scales = tensor_codec.encode(torch.full((scales.shape[0],), float("inf")))
    expect_error(network, share(inf_scales, 1), ErrorCode.BAD_TENSOR, sender="p2")


def test_backward_spot_check_gradients_are_validated_like_backwards():
    """A SpotCheckGradient (protocol 1.7) is taken only from the hop that sends the checked hop its
    gradient, about that hop, by another replica of its stage that kept the input; a bad tensor
    is refused as a backward's would be, and nothing is queued for training."""
    from protocol.spot_checks import SpotCheckGradient
    schedule = make_schedule("t", {"p0": 0, "p1": 1, "q1": 1}, {0: ["p0", "q1"]}, epoch=3)
    network, worker = serve_p1(schedule)

    def gradient(suspect="q1", fill=None, **kw):
        return SpotCheckGradient(header(**kw), suspect, activation(fill=fill))
    expect_error(network, gradient(), ErrorCode.UNKNOWN_MICROBATCH)           # no input kept for it
    worker.spot.backward.keep_input(header(), torch.randn(2, 8, 64))
    expect_error(network, gradient(), ErrorCode.WRONG_STAGE, sender="q1")     # not the next hop
    expect_error(network, gradient(suspect="p1"), ErrorCode.WRONG_STAGE)      # not the checked hop's peer
    expect_error(network, gradient(hop_index=0), ErrorCode.WRONG_STAGE)
    expect_error(network, gradient(fill=float("nan")), ErrorCode.NON_FINITE)
    expect_error(network, gradient(), ErrorCode.WRONG_STAGE, sender="mallory")   # as a SpotCheckRequest
    assert len(worker.inbox) == 0 and worker.spot.serving == 0


def test_a_non_origin_serves_the_origins_epoch_when_a_newer_one_starts_in_its_past():
    """An epoch read after this stage began its first iteration (the coordinator's view was
    stale) does not make it refuse the origins' work of the epoch they kept; work of the newer
    epoch shows the origins took it, and from then on the older one is refused."""
    import dataclasses
    kept = make_schedule("t", {"p0": 0, "p1": 1}, {0: ["p0", "p1"], 1: ["p0", "p1"], 2: ["p0", "p1"]}, epoch=3)
    network, worker = serve_p1(kept)
    worker.book.began(0, as_origin=False)
    worker.book.add(dataclasses.replace(kept, epoch=4))          # from iteration 0: begun already
    assert isinstance(call(network, "p0", m.ForwardRequest(header(), activation())), m.ForwardReply)
    assert isinstance(call(network, "p0", m.ForwardRequest(header(epoch=4, microbatch_id=1), activation())),
                      m.ForwardReply)
    expect_error(network, m.ForwardRequest(header(microbatch_id=2), activation()), ErrorCode.STALE_SCHEDULE)
    assert len(worker.inbox) == 2
