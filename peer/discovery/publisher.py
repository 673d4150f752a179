"""Publishing a record that only its latest version matters for (a peer's progress reports),
off the caller's critical path: kick() starts a put in the background; kicks while one is in
flight coalesce into one more put of the then-latest value. A DHT store on a busy swarm can
take a second or more, and an origin used to wait for it between every two iterations."""
import asyncio
import logging
from typing import Awaitable, Callable, Coroutine

logger = logging.getLogger(__name__)


class LatestPublisher:
    def __init__(self, put: Callable[[], Awaitable[object]], what: str,
                 spawn: Callable[[Coroutine], asyncio.Task] = asyncio.create_task):
        self.put, self.what = put, what
        self.spawn = spawn        # the peer's lifecycle: its end cancels a put in flight
        self._task: asyncio.Task | None = None
        self._again = False
        self.published = 0               # puts that returned without raising

    def kick(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = self.spawn(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.put()
                self.published += 1
            except Exception as exc:
                logger.warning("publishing %s failed: %s", self.what, exc)
            if not self._again:
                return

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout`) for the puts already kicked: before a peer leaves, its last
        progress report must reach the DHT (the coordinator ends the run on it)."""
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task], timeout=timeout)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
