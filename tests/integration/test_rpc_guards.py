"""RpcServer guards: membership, rate limits, stream-byte budget and partial-stream deadlines."""
import asyncio

from protocol import codec
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.tensors import TensorPayload

from peer.security.limits import Admission, Limits
from peer.security.membership import MemberGate
from peer.transport.rpc import RpcClient, RpcServer


async def pong(remote, ping):
    return m.Pong(ping.nonce)


def server(**limits):
    s = RpcServer(max_tensor_bytes=1 << 20, admission=Admission(Limits(**limits)))
    s.register(m.Ping, pong)
    return s


def frames_of(message, unary=0):
    return RpcClient(None, unary_tensor_bytes=unary, chunk_bytes=1024).frames_for(message)


def feeder(frames, stall_after=None):
    pending = list(frames)

    async def recv():
        if stall_after is not None and len(frames) - len(pending) >= stall_after:
            await asyncio.sleep(3600)  # a peer that stops sending half-way
        return pending.pop(0)
    return recv


def reply_of(s, remote, frames, **kw):
    return codec.decode(asyncio.run(s.handle(remote, feeder(frames, **kw))))


def big_forward(nbytes):
    header = m.WorkHeader("t", 1, 0, 0, 1)
    return m.ForwardRequest(header, TensorPayload("uint8", (nbytes,), b"\0" * nbytes))


def test_rate_limit_answers_overloaded_for_that_peer_only():
    s = server(rate_per_s=0.01, burst=3)
    ping = [codec.encode(m.Ping(1))]
    replies = [reply_of(s, "a", ping) for _ in range(5)]
    assert [type(r).__name__ for r in replies] == ["Pong"] * 3 + ["ErrorReply"] * 2
    assert replies[-1].code == ErrorCode.OVERLOADED
    assert isinstance(reply_of(s, "b", ping), m.Pong)


def test_a_partial_stream_times_out_and_frees_its_budget():
    s = server(request_deadline_s=0.3, stream_bytes_budget=10_000)
    frames = frames_of(big_forward(8000))
    reply = reply_of(s, "a", frames, stall_after=2)
    assert reply.code == ErrorCode.MALFORMED and "incomplete" in reply.message
    assert s.admission.stream_bytes == 0 and s.admission.total_in_flight == 0


def test_streams_beyond_the_byte_budget_are_refused():
    s = server(stream_bytes_budget=5000, stream_bytes_per_peer=5000)
    reply = reply_of(s, "a", frames_of(big_forward(8000)))
    assert reply.code == ErrorCode.OVERLOADED and "budget" in reply.message
    reply = reply_of(s, "a", frames_of(big_forward(2 << 20)))   # over max_tensor_bytes
    assert reply.code == ErrorCode.BAD_TENSOR
    assert s.admission.stream_bytes == 0


def test_a_stalled_stream_holds_what_it_sent_not_what_it_declared():
    """Issue 24: one stream declaring the whole budget and then stalling held it for the deadline."""
    s = server(stream_bytes_budget=10_000, request_deadline_s=0.5)

    async def scenario():
        stalled = asyncio.ensure_future(s.handle("greedy", feeder(frames_of(big_forward(10_000)), stall_after=2)))
        await asyncio.sleep(0.1)
        held = s.admission.stream_bytes
        other = codec.decode(await s.handle("honest", feeder(frames_of(big_forward(2000)))))
        return held, other, codec.decode(await stalled)
    held, other, stalled = asyncio.run(scenario())
    assert held == 1024                    # one chunk arrived, 10,000 declared
    assert other.code != ErrorCode.OVERLOADED and stalled.code == ErrorCode.MALFORMED
    assert s.admission.stream_bytes == 0


def test_one_peer_cannot_take_more_than_its_share_of_stream_bytes():
    s = server(stream_bytes_budget=8000, request_deadline_s=0.5)     # a peer's share: 2000

    async def scenario():
        greedy = [asyncio.ensure_future(s.handle("greedy", feeder(frames_of(big_forward(4000)), stall_after=3)))
                  for _ in range(3)]
        await asyncio.sleep(0.1)
        held = s.admission.peer_stream_bytes("greedy")
        other = codec.decode(await s.handle("honest", feeder(frames_of(big_forward(1500)))))
        return held, other, [codec.decode(await g) for g in greedy]
    held, other, greedy = asyncio.run(scenario())
    assert held <= 2000 and other.code != ErrorCode.OVERLOADED
    assert any(g.code == ErrorCode.OVERLOADED and "share" in g.message for g in greedy)
    assert s.admission.stream_bytes == 0


def test_strangers_are_refused_before_their_request_is_read():
    async def members():
        return {"member"}
    s = RpcServer(gate=MemberGate(members))
    s.register(m.Ping, pong)
    read = []

    async def recv():
        read.append(1)
        return codec.encode(m.Ping(1))
    reply = codec.decode(asyncio.run(s.handle("stranger", recv)))
    assert reply.code == ErrorCode.NOT_MEMBER and read == []
    assert isinstance(codec.decode(asyncio.run(s.handle("member", recv))), m.Pong)
