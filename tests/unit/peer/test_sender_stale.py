"""A STALE_SCHEDULE that no retry cures is not retried (peer/pipeline/sender.py): seen in CI's
partition test, the origins kept epoch 2 (they read epoch 3 too late) while the other stages
took epoch 3; every send of the origins' work was retried for its whole 30 s deadline, twice an
iteration, and the swarm stalled a minute an iteration until the coordinator's next epoch."""
import asyncio
from types import SimpleNamespace

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.schedule import Schedule, StageAssignment

from peer.pipeline.schedule_book import ScheduleBook
from peer.pipeline.sender import Sender
from peer.routing.health import Health
from peer.transport.rpc import RemoteError


def send(missed_after) -> int:
    calls = []

    async def call(peer, request, timeout):
        calls.append(peer)
        raise RemoteError(peer, m.ErrorReply(ErrorCode.STALE_SCHEDULE, "epoch 2 does not apply here (we use 3)"))
    from peer.pipeline.settings import WorkerSettings
    rpc = SimpleNamespace(call=call, versions={})
    sender = Sender("o", "r", rpc, Health(), WorkerSettings(send_deadline_s=0.3),
                    SimpleNamespace(current=None), None, None, None, missed_after)
    done = m.IterationDone("r", 2, 62, m.MicrobatchCounts())
    assert asyncio.run(sender.send_with_retries("a", done, "iteration 62 done")) is False
    return len(calls)


def test_work_of_an_epoch_we_keep_after_missing_a_newer_one_is_not_retried_when_stale():
    assert send(lambda epoch: epoch == 2) == 1
    assert send(lambda epoch: False) > 2            # the peer may just not have read ours yet: retried


def test_the_book_says_which_epochs_it_keeps_past_a_missed_one():
    book = ScheduleBook()
    s1 = Schedule("r", 1, "skippipe", 2, 0.0, (StageAssignment("o", 0), StageAssignment("a", 1)), ())
    book.add(s1)
    book.began(40, as_origin=True)
    book.add(Schedule("r", 2, "skippipe", 2, 0.0, s1.assignment, (), start_iteration=28))  # read too late
    assert book.missed(2) and book.missed_after(1) and not book.missed_after(2)


def test_a_forward_refused_as_of_another_epoch_is_given_up_after_a_short_deadline():
    """A stage replica stopped while epoch 2 was current never read it (the DHT holds only the
    newest schedule) and refused the origins' epoch-2 forwards: each was retried 30 s."""
    import time
    from peer.pipeline.settings import WorkerSettings

    async def call(peer, request, timeout):
        raise RemoteError(peer, m.ErrorReply(ErrorCode.STALE_SCHEDULE, "epoch 2 does not apply here (we use 1)"))
    sender = Sender("o", "r", SimpleNamespace(call=call, versions={}), Health(), WorkerSettings(send_deadline_s=30.0),
                    SimpleNamespace(current=None), None, None, None, lambda epoch: False)
    done = m.IterationDone("r", 2, 13, m.MicrobatchCounts())
    t0 = time.monotonic()
    assert asyncio.run(sender.send_with_retries("a", done, "forward", stale_deadline_s=0.5)) is False
    assert time.monotonic() - t0 < 2.0
