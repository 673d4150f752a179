"""One lifecycle per long-running component (issue 22): `run(main)` runs `main` and every task
the component spawns meanwhile in one asyncio.TaskGroup; `shutdown()` (or the stop event
given) ends them; what is still running when `main` returns is cancelled and awaited before
run() returns. The owner's own cleanup goes in its run()'s `finally`.

A spawned task's exception is logged and the others go on: a TaskGroup would otherwise cancel
every sibling, and `main`, over one failed send or refresh, where such a task failed alone
before. Only `main`'s exception ends the run, and it comes out as itself, not as a group.

Tasks spawned while run() is not active (an RPC handler answering before the work loop starts
or after it ended) are plain tasks, kept here so that run()'s end or shutdown() cancels them.
"""
import asyncio
import logging
from typing import Any, Coroutine


class Lifecycle:
    def __init__(self, what: str, log: logging.Logger, stop: asyncio.Event | None = None):
        self.what, self.log = what, log
        self.stop = stop or asyncio.Event()
        self._group: asyncio.TaskGroup | None = None
        self._closing = False
        self._tasks: set[asyncio.Task] = set()   # asyncio keeps only weak references to tasks

    @property
    def running(self) -> bool:
        return self._group is not None and not self._closing

    def spawn(self, coro: Coroutine, what: str = "") -> asyncio.Task:
        """Start `coro` beside `main`; if it raises, the exception is logged and nothing else
        stops. While run() is winding down it is cancelled at once (so it cannot hold the stop up)."""
        wrapped = self._logged(coro, what or getattr(coro, "__qualname__", repr(coro)))
        task = self._group.create_task(wrapped) if self.running else asyncio.create_task(wrapped)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: coro.close())   # cancelled before it started: no "never awaited"
        if self._closing:
            task.cancel()
        return task

    async def _logged(self, coro: Coroutine, what: str) -> Any:
        try:
            return await coro
        except Exception:
            self.log.exception("%s: %s failed (the rest goes on)", self.what, what)
            return None

    async def run(self, main: Coroutine) -> Any:
        """`main`'s result, or None when shutdown() or the stop event ended it first."""
        self._closing = False
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                work = group.create_task(main)
                stopper = group.create_task(self.stop.wait())
                try:
                    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._closing = True
                    for task in (work, stopper, *self._tasks):
                        task.cancel()
        except BaseExceptionGroup as errors:
            # spawned tasks log their own: only main's exception is here, and its callers
            # expect it as itself (StartupError, a crashed worker)
            if len(errors.exceptions) == 1:
                raise errors.exceptions[0] from None
            raise
        finally:
            self._group = None
            await self._cancel_left()
            self._closing = False    # from now on spawns are plain tasks again, for shutdown()
        return None if work.cancelled() else work.result()

    async def _cancel_left(self) -> None:
        """The plain tasks (spawned outside the group): cancelled and awaited."""
        left = list(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def shutdown(self) -> None:
        """Ends run() (its tasks are cancelled and awaited there) and cancels plain tasks
        spawned outside it."""
        self.stop.set()
        if self._group is None:
            for task in list(self._tasks):
                task.cancel()
