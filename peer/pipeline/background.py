"""Work the pipeline starts and does not wait for (sends, spot checks, report publishing)."""
import asyncio
from typing import Coroutine


class Background:
    """Holds each started task until it ends (asyncio keeps only weak references), so that
    none is collected mid-flight and all can be cancelled together when the worker stops."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
