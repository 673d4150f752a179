"""Ready work, keyed by iteration, handed to the worker in planned order; tasks of equal
priority in the order they arrived (first come first served, as the planner's simulator
runs a node that has no planned order: coordinator/planner/simulate.py).

Bounded: at most `max_items` tasks are buffered; beyond that senders get OVERLOADED and
retry (back-pressure instead of unbounded memory).
"""
import asyncio
from typing import Any, Callable

from peer.pipeline.plan_view import TaskKey


class InboxFull(Exception):
    pass


class Inbox:
    def __init__(self, max_items: int = 256):
        self.max_items = max_items
        self._items: dict[tuple[int, TaskKey], Any] = {}   # in arrival order (dicts keep insertion order)
        self._changed = asyncio.Condition()
        self._poked = False

    def __len__(self) -> int:
        return len(self._items)

    def has(self, iteration: int, task: TaskKey) -> bool:
        return (iteration, task) in self._items

    async def put(self, iteration: int, task: TaskKey, payload: Any) -> None:
        async with self._changed:
            if (iteration, task) not in self._items and len(self._items) >= self.max_items:
                raise InboxFull(f"{len(self._items)} tasks waiting")
            self._items.pop((iteration, task), None)   # a re-sent task arrives anew, at the end
            self._items[(iteration, task)] = payload
            self._changed.notify_all()

    async def take(self, iteration: int, allowed: Callable[[TaskKey], bool],
                   priority: Callable[[TaskKey], float], timeout: float) -> tuple[TaskKey, Any] | None:
        """Remove and return the lowest-priority allowed task of `iteration` (of equal ones,
        the first put); None on timeout or on a poke (the caller re-checks its state, e.g.
        whether the iteration is over)."""
        def pick():
            ready = [t for (i, t) in self._items if i == iteration and allowed(t)]
            return min(ready, key=priority) if ready else None   # min keeps the first of equals

        async with self._changed:
            self._poked = False
            try:
                async with asyncio.timeout(max(timeout, 0.0)):
                    await self._changed.wait_for(lambda: self._poked or pick() is not None)
            except TimeoutError:
                return None
            task = pick()
            if task is None:
                return None
            return task, self._items.pop((iteration, task))

    async def poke(self) -> None:
        """Wake the worker so it re-evaluates what is allowed (e.g. memory was freed)."""
        async with self._changed:
            self._poked = True
            self._changed.notify_all()

    def drop_before(self, iteration: int) -> int:
        stale = [k for k in self._items if k[0] < iteration]
        for k in stale:
            del self._items[k]
        return len(stale)
