"""A swarm that several tests share (a module-scoped fixture): the coordinator runs on an event
loop in a background thread, so it keeps planning and counting iterations between tests and
while a test does blocking work; tests run their coroutines on that loop with `run`."""
import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import traceback

LOOP_GRACE_S = 30.0   # past a coroutine's own timeout: the loop itself must be stuck


class LiveSwarm:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="live-swarm", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self.app = None
        self.procs = []

    def run(self, coro, timeout: float):
        """Run `coro` on the swarm's loop and return its result (its exception, if it raised).
        Bounded even when the loop is blocked (then wait_for's own timeout cannot fire): the
        caller gets an error with the loop thread's stack instead of waiting forever, and the
        fixture's teardown, which runs coroutines here too, cannot hang a CI run."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        try:
            return future.result(timeout + LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:   # (TimeoutError itself: also the coroutine's own)
            if future.done():
                raise
            future.cancel()
            raise AssertionError(f"the live swarm's event loop did not finish a {timeout:.0f}s coroutine "
                                 f"within {LOOP_GRACE_S:.0f}s more; its thread was at:\n{self.loop_stack()}") from None

    def loop_stack(self) -> str:
        frame = sys._current_frames().get(self._thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(the loop thread has ended)"

    def start(self, coordinator_cm, peers_cm_factory, timeout: float = 120.0) -> None:
        """coordinator_cm: an async context manager yielding the app (bench.support.harness.coordinator);
        peers_cm_factory(app): a context manager yielding the peer processes (harness.peers)."""
        async def up():
            self.app = await self._stack.enter_async_context(coordinator_cm)
            self.procs = self._stack.enter_context(peers_cm_factory(self.app))
        self.run(up(), timeout)

    def close(self) -> None:
        try:
            # peers stop (and are waited for) off the loop, then the coordinator leaves
            self.run(self._stack.aclose(), 120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
            self.loop.close()
