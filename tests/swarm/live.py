"""A swarm that several tests share (a module-scoped fixture): the coordinator runs on an event
loop in a background thread, so it keeps planning and counting iterations between tests and
while a test does blocking work; tests run their coroutines on that loop with `run`."""
import asyncio
import contextlib
import threading


class LiveSwarm:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="live-swarm", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        self.app = None
        self.procs = []

    def run(self, coro, timeout: float):
        """Run `coro` on the swarm's loop and return its result (its exception, if it raised)."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result()

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
