"""Watching the swarm from one peer: who departed, and whether we are the one cut off.

Each period we read the adverts (peer/routing/departures.py judges them). While reads stay
unreliable (our own advert or most peers missing) we dial a few scheduled peers: if none
answers we are cut off, say so, and the worker sits the partition out (peer/pipeline/rejoin.py);
when reads are sound again or a peer answers, we are back and the worker rejoins.
"""
import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from protocol import messages as m

from peer.routing.departures import DepartureWatch, Verdict
from peer.transport.rpc import RemoteError

if TYPE_CHECKING:
    from peer.discovery.dht_records import PeerRecords
    from peer.pipeline.ledger import Ledger
    from peer.pipeline.rejoin import Isolation
    from peer.pipeline.schedule_book import ScheduleBook
    from peer.routing.health import Health
    from peer.transport.rpc import RpcClient

logger = logging.getLogger("skippipe.peer")
PROBED_PEERS = 3            # dialed per check while our view is unreliable
PING_TIMEOUT_S = 4.0         # a loaded volunteer's loop answers late; a dead link never does


class IsolationMonitor:
    """Writes what it concludes into the parts it shares with the worker: `health` (departed
    peers) and `isolation` (cut off or not); reads the running schedule from `ledger`."""

    def __init__(self, isolation: "Isolation", health: "Health", ledger: "Ledger", book: "ScheduleBook",
                 records: "PeerRecords", rpc: "RpcClient", me: str, announce_period_s: float,
                 period_s: float = 1.0, rebootstrap: Callable[[list[str]], Awaitable[int]] | None = None):
        self.isolation, self.health, self.ledger, self.book = isolation, health, ledger, book
        self.records, self.rpc, self.me = records, rpc, me
        self.rebootstrap = rebootstrap           # refills our DHT routing table (see discovery/)
        self.grace_s = 2 * announce_period_s     # one late advert on a busy machine is no departure
        self.period_s = period_s
        self.watch = DepartureWatch(me, self.grace_s)
        self._unreliable_since: float | None = None
        self._next_probe = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            schedule = self.ledger.current
            if schedule is not None:
                await self.check(list(schedule.stage_of()))

    async def check(self, scheduled: list[str]) -> Verdict:
        try:
            adverts = {p: a.state for p, a in (await self.records.get_adverts()).items()}
        except Exception as exc:  # a failed lookup is as unreliable as an empty one
            logger.debug("listing peers failed: %s", exc)
            adverts = None
        verdict = self.watch.observe(scheduled, adverts)
        if verdict.departed != self.health.departed:
            logger.info("departed peers: %s", sorted(p[:12] for p in verdict.departed))
        self.health.set_departed(verdict.departed)
        await self._judge(verdict, [p for p in scheduled if p != self.me])
        return verdict

    async def _judge(self, verdict: Verdict, others: list[str]) -> None:
        cut_off = self.isolation.cut_off
        if verdict.reliable:
            self._unreliable_since = None
            if cut_off:
                self._set(False, "the DHT shows the swarm again")
            return
        now = time.monotonic()
        if self._unreliable_since is None:
            self._unreliable_since = now
            logger.info("the DHT shows only %d of the %d other scheduled peers; checking our own link",
                        verdict.others - verdict.missing, verdict.others)
        if now - self._unreliable_since < self.grace_s or now < self._next_probe or not others:
            return
        self._next_probe = now + self.grace_s
        # a peer that took one of our calls just now proves the link: a loaded machine's slow
        # pings (or a pick of three that were all killed) once took a busy peer for cut off
        answered = self.health.answered_within(others, self.grace_s) or await self._anyone_answers(others)
        if answered:   # the network works but our DHT view does not: our routing table may be empty
            await self._refill_dht(others)
        if answered and cut_off:
            self._set(False, f"peer {answered[:12]} answers again")
        elif not answered and not cut_off:
            self._set(True, f"for {now - self._unreliable_since:.0f}s the DHT has shown "
                            f"{verdict.others - verdict.missing} of {verdict.others} scheduled peers, "
                            f"and none of {min(len(others), PROBED_PEERS)} dialed answers")

    async def _anyone_answers(self, others: list[str]) -> str | None:
        picked = random.sample(others, min(len(others), PROBED_PEERS))

        async def ping(peer: str) -> str | None:
            try:
                await self.rpc.call(peer, m.Ping(random.getrandbits(32)), PING_TIMEOUT_S)
                return peer
            except RemoteError:          # an error reply is still an answer: the link works
                return peer
            except Exception:
                return None
        for peer in await asyncio.gather(*(ping(p) for p in picked)):
            if peer is not None:
                return peer
        return None

    async def _refill_dht(self, others: list[str]) -> None:
        if self.rebootstrap is None:
            return
        try:
            await self.rebootstrap(others)
        except Exception as exc:
            logger.debug("refilling the DHT routing table failed: %s", exc)

    def _set(self, cut_off: bool, why: str) -> None:
        latest = self.book.latest
        self.isolation.set(cut_off, latest.epoch if latest is not None else 0)
        if cut_off:
            logger.warning("this peer seems CUT OFF from the swarm: %s. Training pauses; check this "
                           "machine's network (it rejoins by itself when the swarm is reachable)", why)
        else:
            logger.warning("back in touch with the swarm (%s): rejoining", why)
