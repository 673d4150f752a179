"""Relayed peers in the planner (issue 28): a peer behind NAT that others reach only through a
libp2p circuit relay gets its links made dearer, so that the cost-driven partition and path
search give it the stages and the microbatches where its traffic is smallest and least on the
critical path (docs/nat.md).

Why a penalty on top of the measured links: the link probes measure a relayed link like any other
(they dial the peer's /p2p-circuit address), but one probe sees the relay idle. In a swarm, the
relay's one uplink carries every relayed pair's bytes in both directions, the relay service caps
each circuit (p2pd: 4 GiB per direction, 30 min) and a relay that leaves takes the link with it.
So a relayed link is planned as if it had `bandwidth_divisor` times less bandwidth and
`extra_latency_ms` more latency than measured: SkipPipe routes fewer microbatches through it and
avoids making a relayed peer a data node (stage 0), whose microbatches have no way around it.
"""
from dataclasses import replace

from protocol.topology import Links, Topology

RELAYED = "relayed"                    # the reachability verdict of peer/reachability.py
BANDWIDTH_DIVISOR = 4.0
EXTRA_LATENCY_MS = 5.0


def relayed_ids(reachability: dict[str, str], maddrs: dict[str, tuple[str, ...]]) -> set[str]:
    """Peers that others reach only through a relay: their self-test said so, or every address
    they advertise is a /p2p-circuit one."""
    out = {p for p, verdict in reachability.items() if verdict == RELAYED}
    out |= {p for p, addrs in maddrs.items() if addrs and all("/p2p-circuit" in a for a in addrs)}
    return out


def penalise_relayed(topology: Topology, relayed: set[str], bandwidth_divisor: float = BANDWIDTH_DIVISOR,
                     extra_latency_ms: float = EXTRA_LATENCY_MS) -> Topology:
    """The topology with every link that has a relayed end made dearer (once, also when both ends
    are relayed: the dialer reaches the other's relay, one relay hop)."""
    if bandwidth_divisor < 1 or extra_latency_ms < 0:
        raise ValueError("a relay penalty makes links dearer: divisor >= 1, extra latency >= 0")
    flagged = [node.id in relayed for node in topology.nodes]
    if not any(flagged):
        return topology
    latency = [list(row) for row in topology.links.latency_ms]
    bandwidth = [list(row) for row in topology.links.bandwidth_gib_s]
    for a, row in enumerate(latency):
        for b in range(len(row)):
            if a != b and (flagged[a] or flagged[b]):
                latency[a][b] += extra_latency_ms
                bandwidth[a][b] /= bandwidth_divisor
    links = Links(tuple(map(tuple, latency)), tuple(map(tuple, bandwidth)))
    return replace(topology, links=links)
