"""Start-up reachability self-test: can other peers dial us, and are we relayed?

What one machine can check by itself: (1) our libp2p listener accepts a TCP connection on
every address we advertise, (2) whether any advertised address is public (not loopback /
private), (3) whether libp2p fell back to a relay (/p2p-circuit addresses). Whether a peer
elsewhere really dialed us is seen later: PeerMetrics counts distinct inbound peers.
"""
import asyncio
import ipaddress
import logging
from dataclasses import asdict, dataclass, field

from swarmcore.relay import visible_maddrs

logger = logging.getLogger("skippipe.peer.reachability")
DIAL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Reachability:
    verdict: str                         # public | local-only | relayed | unreachable | unknown
    addresses: tuple[str, ...] = ()
    dialable: tuple[str, ...] = ()       # addresses whose TCP listener accepted our test dial
    relayed: bool = False
    public: bool = False
    advice: str = ""
    inbound_peers: int = 0               # filled in later from what actually arrived
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def split_maddr(maddr: str) -> tuple[str, str, int] | None:
    """'/ip4/1.2.3.4/tcp/31337/p2p/Qm..' -> ('ip4', '1.2.3.4', 31337); None if not TCP/IP."""
    parts = maddr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6", "dns4", "dns6", "dns") or parts[2] != "tcp":
        return None
    try:
        return parts[0], parts[1], int(parts[3])
    except ValueError:
        return None


def is_public(kind: str, host: str) -> bool:
    if kind.startswith("dns"):
        return host != "localhost"
    try:
        return ipaddress.ip_address(host).is_global
    except ValueError:
        return False


async def can_dial(host: str, port: int, timeout_s: float = DIAL_TIMEOUT_S) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def self_test(maddrs: list[str], announced: bool = False, timeout_s: float = DIAL_TIMEOUT_S) -> Reachability:
    """Classify our advertised multiaddrs (see the module docstring). `announced`: the user
    passed --announce-maddrs (a forwarded port), so a public address there is intended."""
    relayed = any("/p2p-circuit" in m for m in maddrs)
    direct = [(m, s) for m in maddrs if "/p2p-circuit" not in m and (s := split_maddr(m)) is not None]
    results = await asyncio.gather(*(can_dial(host, port, timeout_s) for _, (_, host, port) in direct))
    dialable = tuple(m for (m, _), ok in zip(direct, results) if ok)
    public = any(is_public(kind, host) for _, (kind, host, _) in direct)
    ports = sorted({port for _, (_, _, port) in direct})
    port_text = "/".join(map(str, ports)) or "<port>"
    if direct and not dialable and not relayed:
        verdict = "unreachable"
        advice = (f"our own listener did not accept a connection on {', '.join(m for m, _ in direct)}: "
                  f"check --host-maddrs and that no firewall on this machine blocks TCP port {port_text}")
    elif public and dialable:
        verdict, advice = "public", ""
        if not announced:
            advice = "reachable on a public address; if that is behind NAT, forward TCP port " + port_text
    elif relayed:
        verdict = "relayed"
        advice = (f"other peers reach us only through a relay (slower); to be dialed directly, forward "
                  f"TCP port {port_text} to this machine and pass --announce-maddrs /ip4/<public-ip>/tcp/{port_text}")
    elif dialable:
        verdict = "local-only"
        advice = (f"only private or loopback addresses: peers outside this network cannot dial us. Forward "
                  f"TCP port {port_text} on your router and pass --announce-maddrs /ip4/<public-ip>/tcp/{port_text} "
                  f"(with a fixed port in --host-maddrs); without a forward, --relay-via <4 relays' addresses> "
                  f"lets peers that we never dialled reach us (docs/nat.md); or ignore this for a local swarm")
    else:
        verdict, advice = "unknown", "no TCP address to test (only non-IP transports are advertised)"
    return Reachability(verdict, tuple(maddrs), dialable, relayed, public, advice)


async def run_self_test(p2p, announced: bool) -> Reachability:
    """The test on a hivemind P2P instance; never raises (a failed test is a verdict)."""
    try:
        maddrs = await visible_maddrs(p2p)    # retried: empty for a moment while a relay slot comes in
        result = await self_test(maddrs, announced)
    except Exception as exc:  # the daemon could not tell us its addresses
        result = Reachability("unknown", advice=f"self-test failed: {exc}")
    log = logger.info if result.verdict in ("public", "local-only") else logger.warning
    log("reachability: %s%s", result.verdict, f" ({result.advice})" if result.advice else "")
    return result
