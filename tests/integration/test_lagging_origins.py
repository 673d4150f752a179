"""A peer that missed an origin's IterationDone (stopped or cut off when it came) learns that
the origin moved on from the origin's later work, a later IterationDone, or the origin's DHT
progress record, instead of waiting out the iteration timeout (issue 25)."""
import asyncio

import pytest
import torch

from protocol import messages as m
from protocol.errors import ErrorCode

from peer.compute import tensor_codec
from peer.compute.runner import StageRunner
from peer.pipeline.flights import IterationState
from peer.pipeline.handlers import WorkHandlers
from peer.pipeline.lagging_origins import LaggingOrigins, done_with
from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.worker import PipelineWorker, StageSeat, WorkerSettings
from peer.transport.memory import MemoryNetwork
from peer.transport.rpc import RemoteError, RpcClient, RpcServer
from bench.support.memory_swarm import make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, microbatch_samples=2, seq_len=8)
# o and o2 are origins; mb 0 goes o -> m -> z, mb 1 o2 -> m -> z; we are z (stage 2)
SCHEDULE = make_schedule("t", {"o": 0, "o2": 0, "m": 1, "z": 2}, {0: ["o", "m", "z"], 1: ["o2", "m", "z"]}, epoch=3)


def serve_z():
    network, book = MemoryNetwork(), ScheduleBook()
    book.add(SCHEDULE)
    worker = PipelineWorker("z", SPEC, RpcClient(network.transport("z")), book,
                            StageSeat(lambda s: StageRunner.from_spec(SPEC, s)), settings=WorkerSettings())
    worker.seat.runner, worker.seat.stage = StageRunner.from_spec(SPEC, 2), 2
    server = RpcServer()

    async def no_refresh():
        return None
    WorkHandlers(worker, no_refresh).register(server)
    asyncio.run(network.transport("z").serve(server.handle))
    return network, worker


def call(network, sender, message):
    return asyncio.run(RpcClient(network.transport(sender)).call("z", message, 5.0))


def done(iteration):
    return m.IterationDone("t", 3, iteration, m.MicrobatchCounts(completed=1))


def done_origins(worker, iterations):
    return [worker.ledger.state(i).done_origins for i in iterations]


def test_a_later_iteration_done_ends_the_missed_ones():
    network, worker = serve_z()
    call(network, "o", done(2))                      # its done for 0 and 1 never came
    assert done_origins(worker, [0, 1, 2]) == [{"o"}, {"o"}, {"o"}]
    with pytest.raises(RemoteError) as info:         # only an origin of the schedule speaks for itself
        call(network, "m", done(2))
    assert info.value.code == ErrorCode.NOT_MEMBER
    assert "m" not in worker.ledger.state(0).done_origins


def test_an_origins_later_work_through_another_hop_ends_the_missed_ones():
    network, worker = serve_z()
    header = m.WorkHeader(run="t", epoch=3, iteration=2, microbatch_id=0, hop_index=2)
    activation = tensor_codec.encode(torch.randn(2, 8, 64))
    with pytest.raises(RemoteError):                 # from the wrong hop: refused, and proves nothing
        call(network, "o2", m.ForwardRequest(header, activation))
    assert done_origins(worker, [0, 1]) == [set(), set()]
    call(network, "m", m.ForwardRequest(header, activation))   # o's microbatch of iteration 2
    assert done_origins(worker, [0, 1]) == [{"o"}, {"o"}]
    assert "o" not in worker.ledger.state(2).done_origins      # its iteration 2 is still on


def progress(peer, *iterations, claimed=None):
    reports = tuple(m.IterationReport(peer, 3, i, 1.0, 2, 16, 0.0, 1.0, m.MicrobatchCounts(completed=1))
                    for i in iterations)
    return m.ProgressRecord(claimed or peer, reports)


def test_done_with_counts_only_an_origins_own_record_of_that_iteration_or_later():
    records = {"o": progress("o", 4, 5), "o2": progress("o2", 3), "x": progress("x", 9, claimed="o")}
    assert done_with(4, {"o", "o2", "x"}, records) == {"o": 5}
    assert done_with(3, {"o", "o2"}, records) == {"o": 5, "o2": 3}
    assert done_with(4, {"o3"}, records) == {}


async def test_the_backstop_reads_progress_only_when_waiting_long_and_marks_the_origin_done():
    reads, woken = [], []

    async def read():
        reads.append(1)
        return {"o": progress("o", 6), "o2": progress("o2", 4)}

    async def wake():
        woken.append(1)
    spawned = []

    def spawn(coro, what=""):
        spawned.append(asyncio.ensure_future(coro))
        return spawned[-1]
    lagging = LaggingOrigins(read, spawn, wake)
    st = IterationState(5)
    lagging.check(5, st, {"o", "o2"})
    assert not spawned                               # waited less than MIN_WAIT_S: no DHT read
    lagging._last_read -= LaggingOrigins.MIN_WAIT_S + 0.1
    lagging.check(5, st, {"o", "o2"})
    lagging.check(5, st, {"o", "o2"})                # one read at a time
    await asyncio.gather(*spawned)
    assert len(reads) == 1 and st.done_origins == {"o"} and woken == [1]
    lagging._last_read -= LaggingOrigins.MIN_WAIT_S + 0.1
    lagging.check(5, st, set())                      # nobody missing: nothing to read
    assert len(spawned) == 1


async def test_a_slow_swarm_waits_a_typical_iteration_before_reading():
    async def read():
        return {}
    lagging = LaggingOrigins(read, lambda c, w="": asyncio.ensure_future(c), lambda: asyncio.sleep(0),
                             typical_iteration_s=40.0)
    assert lagging.every_s == 40.0


async def test_when_every_origin_is_past_the_next_iteration_the_backstop_says_where_the_swarm_is():
    records = {"o": progress("o", 9, 12), "o2": progress("o2", 11)}

    async def read():
        return records
    tasks = []
    lagging = LaggingOrigins(read, lambda c, w="": tasks.append(asyncio.ensure_future(c)) or tasks[-1],
                             lambda: asyncio.sleep(0))
    woken = []

    async def wake():
        woken.append(1)
    lagging.wake = wake
    lagging._last_read -= LaggingOrigins.MIN_WAIT_S + 0.1
    st = IterationState(5)
    lagging.check(5, st, {"o", "o2"}, {"o", "o2"})
    await asyncio.gather(*tasks)
    assert lagging.swarm_at == 12             # the slower origin finished 11: the swarm is at 12
    # the worker is woken to catch up; the iteration is not ended as if the origins were done
    # with it (it then ended normally and the peer walked on, one read an iteration)
    assert woken == [1] and st.done_origins == set()
    records["o2"] = progress("o2", 4)          # one origin not even past ours: no catch-up
    lagging = LaggingOrigins(read, lambda c, w="": tasks.append(asyncio.ensure_future(c)) or tasks[-1],
                             lambda: asyncio.sleep(0))
    lagging._last_read -= LaggingOrigins.MIN_WAIT_S + 0.1
    lagging.check(5, IterationState(5), {"o", "o2"}, {"o", "o2"})
    await asyncio.gather(*tasks)
    assert lagging.swarm_at is None
