"""Dialling a peer again by the addresses it advertises now.

p2pd dials a peer by id with the addresses its peerstore remembers, which it learned when they
last connected. A relayed peer whose relay died reserves a slot on another relay within seconds
(docs/nat.md), but its old circuit addresses stay in our peerstore (and in p2pd's dial backoff)
for minutes, and nothing tells our daemon the new ones unless the two peers still share a live
connection: in CI51 both peers' slots were on the relays that died, and the stage-0 peer dialled
home's old addresses in vain until the test ended. Our DHT advert of a peer carries its current addresses (a
relayed peer re-announces them when its slots change), so on a failed dial we hand those to p2pd
and dial once more.
"""
import asyncio
import logging
import time
from typing import Awaitable, Callable, Sequence

import multiaddr
from hivemind.p2p import PeerID

logger = logging.getLogger(__name__)
MIN_INTERVAL_S = 2.0     # per peer: a dead peer's failed dials do not become a DHT read each
MAX_ADDRESSES = 16       # what we hand p2pd from one advert (adverts are bounded; this is lower)

Advertised = Callable[[str], Awaitable[Sequence[str]]]


def daemon_maddrs(peer: str, maddrs: Sequence[str]) -> list[multiaddr.Multiaddr]:
    """`maddrs` without the trailing /p2p/<peer> (p2pd's connect wants the bare transport
    address; a circuit address keeps its relay's /p2p/ part), in the binary form p2pd parses
    (the `multiaddr` package encodes /p2p/ as go-multiaddr does; hivemind's own class does not).
    Unparseable ones are dropped."""
    out = []
    for maddr in list(maddrs)[:MAX_ADDRESSES]:
        head, _, tail = str(maddr).rpartition("/p2p/")
        bare = head if head and tail == peer else str(maddr)
        try:
            out.append(multiaddr.Multiaddr(bare))
        except Exception:   # an advert is a remote's claim: a bad address is skipped, not fatal
            logger.debug("skipping unparseable address %r of %s", maddr, peer[:12])
    return out


class Redialer:
    """`await redialer(peer, timeout_s, dial_error)`: True when p2pd connected to `peer` by an
    advertised address it had not tried (the error lists those it tried: `* [<addr>] ...`), so
    that a request that failed to dial may be sent again. A dead peer's advert names only the
    addresses that just failed: its failure stays as quick as it was."""

    def __init__(self, p2p, advertised: Advertised, min_interval_s: float = MIN_INTERVAL_S):
        self.p2p, self.advertised, self.min_interval_s = p2p, advertised, min_interval_s
        self._last: dict[str, float] = {}

    async def __call__(self, peer: str, timeout_s: float, dial_error: str = "") -> bool:
        now = time.monotonic()
        if now - self._last.get(peer, -self.min_interval_s) < self.min_interval_s or timeout_s <= 0:
            return False
        self._last[peer] = now
        try:
            async with asyncio.timeout(timeout_s):
                addresses = [m for m in daemon_maddrs(peer, await self.advertised(peer))
                             if f"[{m}]" not in dial_error]
                if not addresses:
                    return False
                await self.p2p._client.connect(PeerID.from_base58(peer), addresses)
        except Exception as exc:   # not reachable that way either: the caller's error stands
            logger.debug("dialling %s by its advertised addresses failed: %s", peer[:12], exc)
            return False
        logger.info("reached %s by the addresses it advertises now (p2pd's were stale)", peer[:12])
        return True
