"""hivemind's (libp2p's) circuit relay for peers behind NAT (issue 28), shared by the peer and
the coordinator.

A node with a public address can serve as a relay (`--serve-relay`): its reachability is forced
to public, which is what starts p2pd's relay service (p2pd runs it only on a node that believes
it is public; left to AutoNAT that may take minutes or never happen). A peer behind NAT without
a forwarded port names relays (`--relay-via`): p2pd's autorelay reserves a slot on them and the
peer advertises /p2p-circuit addresses through them, so that peers it never dialled can reach it.

Measured (bench/relay_probe.py, docs/nat.md#relays): autorelay reserves at once only when it has
at least MIN_RELAYS candidates; with fewer it waits its boot delay (3 minutes) first. Autorelay
holds two slots; one that lost both (their relays died) reserved another in 2-5 s in the NAT
namespaces, with two live candidates left. Its new circuit addresses reach only peers it still
shares a connection with: `watch_circuits` re-announces them, peer/transport/redial.py dials by them.
"""
import asyncio
import time

MIN_RELAYS = 4            # libp2p autorelay's minimum candidates before it reserves without waiting
CIRCUIT = "/p2p-circuit"
RELAY_WATCH_S = 2.0       # how often a --relay-via peer checks its slots (one local daemon call)


class RelayConfigError(ValueError):
    pass


def relay_kwargs(relay_via: tuple[str, ...] = (), serve_relay: bool = False) -> dict:
    """Extra hivemind DHT / P2P.create arguments for these settings ({} when both are off:
    hivemind's defaults, which dial others' circuit addresses but reserve and serve nothing)."""
    if relay_via and serve_relay:
        raise RelayConfigError("--relay-via (we are behind NAT) and --serve-relay (we are public) exclude each other")
    bad = [m for m in relay_via if "/p2p/" not in m or CIRCUIT in m]
    if bad:
        raise RelayConfigError(f"--relay-via needs each relay's full address with its peer id "
                               f"(/ip4/<ip>/tcp/<port>/p2p/<id>), got {', '.join(bad)}")
    if relay_via:
        return dict(use_relay=True, use_auto_relay=True, force_reachability="private",
                    trusted_relays=list(relay_via))
    if serve_relay:
        return dict(use_relay=True, force_reachability="public")
    return {}


def relay_count_advice(relay_via: tuple[str, ...]) -> str:
    """A warning for too few relays ('' when enough or none)."""
    if not relay_via or len(set(relay_via)) >= MIN_RELAYS:
        return ""
    return (f"--relay-via names {len(set(relay_via))} relay(s): libp2p reserves a relay slot at once only with "
            f"{MIN_RELAYS} or more, with fewer it waits about 3 minutes, and until then peers that we did not "
            f"dial cannot reach us")


def circuit_maddrs(maddrs) -> list[str]:
    return [str(m) for m in maddrs if CIRCUIT in str(m)]


async def wait_for_circuit(p2p, timeout_s: float, poll_s: float = 0.25) -> list[str]:
    """Our /p2p-circuit addresses once autorelay has a reservation, or [] after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = circuit_maddrs(await visible_maddrs(p2p, tries=1))
        if found or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)


async def visible_maddrs(p2p, tries: int = 40, poll_s: float = 0.25) -> list[str]:
    """Our advertised addresses. While autorelay swaps our public addresses for circuit ones the
    daemon may briefly have none (hivemind raises "No multiaddrs found"): ask again a few times."""
    for attempt in range(tries):
        try:
            found = [str(m) for m in await p2p.get_visible_maddrs(latest=True)]
        except ValueError:
            found = []
        if found or attempt == tries - 1:
            return found
        await asyncio.sleep(poll_s)
    return []


async def watch_circuits(p2p, circuits: list[str], on_change, period_s: float = RELAY_WATCH_S) -> None:
    """Call on_change(maddrs, circuits) each time our /p2p-circuit addresses change: a relay died
    (its slot is gone) or autorelay reserved another. A look that finds no address at all (the
    daemon swapping them) is no change."""
    known = set(circuits)
    while True:
        await asyncio.sleep(period_s)
        maddrs = await visible_maddrs(p2p, tries=4)
        now = circuit_maddrs(maddrs)
        if maddrs and set(now) != known:
            known = set(now)
            on_change(maddrs, now)
