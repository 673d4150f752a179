"""Who may call this peer's RPCs: with a join key, only peers whose adverts carry a valid member
proof (checked by PeerRecords.get_adverts). Strangers are refused before their request is read.

The member set is refreshed from the DHT periodically and, when an unknown peer calls (a member
that has just joined), at most once per `min_refresh_s`, so a flood of strangers cannot turn
into a flood of DHT reads.
"""
import asyncio
import logging
import time
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)


class MemberGate:
    def __init__(self, list_members: Callable[[], Awaitable[set[str]]], always: set[str] = frozenset(),
                 min_refresh_s: float = 1.0, refresh_timeout_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic):
        self.list_members = list_members
        self.always = set(always)      # e.g. ourselves
        self.members: set[str] = set()
        self.min_refresh_s = min_refresh_s
        self.refresh_timeout_s = refresh_timeout_s
        self.clock = clock
        self._last_refresh = float("-inf")
        self._refreshing: asyncio.Task | None = None
        self.refused = 0

    async def refresh(self) -> None:
        self._last_refresh = self.clock()
        try:
            async with asyncio.timeout(self.refresh_timeout_s):
                self.members = set(await self.list_members())
        except Exception as exc:  # keep the previous set: a DHT hiccup must not lock members out
            logger.debug("refreshing the member list failed: %s", exc)

    async def admit(self, remote: str) -> bool:
        if remote in self.members or remote in self.always:
            return True
        if self._refreshing is not None:       # someone else's refresh: wait for it, not a new one
            await asyncio.shield(self._refreshing)
        elif self.clock() - self._last_refresh >= self.min_refresh_s:
            self._refreshing = asyncio.ensure_future(self.refresh())
            try:
                await asyncio.shield(self._refreshing)
            finally:
                self._refreshing = None
        if remote in self.members:
            return True
        self.refused += 1
        return False

    async def run(self, period_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(period_s)
