"""DHT traffic at the iteration boundary kept off the critical path: the schedule read that
overlaps the gradient exchange (peer/pipeline/schedule_book.py BoundaryRead) and the progress
report published in the background (peer/discovery/publisher.py LatestPublisher)."""
import asyncio

from peer.discovery.publisher import LatestPublisher
from peer.pipeline.schedule_book import BoundaryRead


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_the_boundary_read_starts_once_and_is_awaited_before_the_next_iteration():
    async def main():
        reads, release = [], asyncio.Event()

        async def refresh():
            reads.append("read")
            await release.wait()
        br = BoundaryRead(lambda: refresh, asyncio.create_task)
        br.start()
        br.start()                                  # the same boundary: no second read
        await asyncio.sleep(0.01)
        assert reads == ["read"]
        finishing = asyncio.create_task(br.finish())
        await asyncio.sleep(0.05)
        assert not finishing.done()                 # the next iteration waits for that read
        release.set()
        await finishing
        await br.finish()                           # no read started: finish() starts and awaits one
        assert reads == ["read", "read"]
    run(main())


def test_a_hung_or_failing_read_does_not_hold_the_iteration_past_its_bound():
    async def main():
        async def hung():
            await asyncio.Event().wait()

        async def broken():
            raise ConnectionError("dht down")
        BoundaryRead.READ_TIMEOUT_S, saved = 0.1, BoundaryRead.READ_TIMEOUT_S
        try:
            loop = asyncio.get_running_loop()
            for fn in (hung, broken):
                t0 = loop.time()
                await BoundaryRead(lambda: fn, asyncio.create_task).finish()
                assert loop.time() - t0 < 1.0
        finally:
            BoundaryRead.READ_TIMEOUT_S = saved
        await BoundaryRead(lambda: None, asyncio.create_task).finish()   # no refresh wired: nothing to do
    run(main())


def test_progress_puts_coalesce_to_the_latest_and_flush_waits_for_them():
    async def main():
        value, seen, gate = [0], [], asyncio.Event()

        async def put():
            seen.append(value[0])
            await gate.wait()
        pub = LatestPublisher(put, "progress")
        pub.kick()                                  # returns at once: the caller never waits
        await asyncio.sleep(0.01)
        for v in (1, 2, 3):                         # three reports while the first put is in flight
            value[0] = v
            pub.kick()
        gate.set()
        await pub.flush(timeout=5.0)
        assert seen == [0, 3] and pub.published == 2   # one more put, of the latest value
    run(main())


def test_a_failed_put_is_logged_and_the_next_kick_tries_again(caplog):
    async def main():
        calls = []

        async def put():
            calls.append(1)
            if len(calls) == 1:
                raise TimeoutError("slow dht")
        pub = LatestPublisher(put, "progress")
        pub.kick()
        await pub.flush(timeout=5.0)
        pub.kick()
        await pub.flush(timeout=5.0)
        assert len(calls) == 2 and pub.published == 1
    run(main())
    assert "publishing progress failed" in caplog.text
