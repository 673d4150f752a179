"""Re-filling our DHT routing table after a partition.

While cut off, our DHT node drops every neighbour that stopped answering; once the network is
back it would store our advert only on itself, and nobody (the coordinator included) would see
us again. So on the way back we ping the peers we know (the schedule's and the initial peers)
from inside the DHT process, which adds them back, and look up our own neighbourhood, as the
DHT does when it starts.
"""
import asyncio
import logging
from functools import partial
from typing import Iterable

from hivemind import DHT
from hivemind.p2p import PeerID

logger = logging.getLogger(__name__)
LOOKUP_TIMEOUT_S = 5.0


def peer_ids_of(maddrs: Iterable[str]) -> list[str]:
    """The /p2p/<id> parts of multiaddrs (those without one are skipped)."""
    out = []
    for maddr in maddrs:
        parts = str(maddr).split("/p2p/")
        if len(parts) == 2 and parts[1]:
            out.append(parts[1].split("/")[0])
    return out


async def _ping_and_lookup(_dht, node, peer_ids: list[str]) -> int:
    """Runs inside the DHT process; returns how many peers answered."""
    answers = await asyncio.gather(*(node.protocol.call_ping(PeerID.from_base58(p), validate=False, strict=False)
                                     for p in peer_ids), return_exceptions=True)
    lookup = asyncio.create_task(node.find_nearest_nodes([node.node_id]))
    await asyncio.wait([lookup], timeout=LOOKUP_TIMEOUT_S)
    if not lookup.done():
        lookup.cancel()
    return sum(1 for a in answers if a is not None and not isinstance(a, BaseException))


async def rebootstrap(dht: DHT, peer_ids: Iterable[str], timeout: float = 15.0) -> int:
    ids = sorted({p for p in peer_ids if p})
    if not ids:
        return 0
    future = dht.run_coroutine(partial(_ping_and_lookup, peer_ids=ids), return_future=True)
    answered = await asyncio.wait_for(future, timeout)
    logger.info("DHT routing table refilled: %d of %d known peers answered", answered, len(ids))
    return answered
