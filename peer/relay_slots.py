"""A --relay-via peer's relay slots (docs/nat.md): the wait for the first one at start-up, so
that our advert carries the circuit addresses others dial us by, and what we do when they change
later (swarmcore.relay.watch_circuits calls `slots_changed`): log it and announce the new
addresses, which peers that lost their connection to us dial by (peer/transport/redial.py)."""
import logging
import time

from swarmcore.relay import relay_count_advice, wait_for_circuit

logger = logging.getLogger("skippipe.peer")
RELAY_WAIT_S = 20.0          # how long we wait for a relay slot before announcing


async def wait_for_slot(p2p, relay_via: tuple[str, ...]) -> list[str]:
    """Our circuit addresses once autorelay reserved a slot ([] after RELAY_WAIT_S, warned)."""
    if (advice := relay_count_advice(relay_via)):
        logger.warning(advice)
    t0 = time.monotonic()
    circuits = await wait_for_circuit(p2p, RELAY_WAIT_S)
    if circuits:
        logger.info("relay slot reserved after %.1f s: reachable at %s", time.monotonic() - t0, ", ".join(circuits))
    else:
        logger.warning("no relay slot after %.0f s (are the --relay-via peers up, public and started with "
                       "--serve-relay?): only peers we dial ourselves can reach us", RELAY_WAIT_S)
    return circuits


def slots_changed(announcer, maddrs: list[str], circuits: list[str]) -> None:
    if circuits:
        logger.info("relay slots changed: reachable at %s", ", ".join(circuits))
    else:
        logger.warning("lost every relay slot (the relays left or died): only peers we dial ourselves can "
                       "reach us until libp2p reserves another (seconds, while another --relay-via relay is up)")
    announcer.update(maddrs=tuple(maddrs))
