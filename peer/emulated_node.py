"""Which emulated topology node this peer is, and which node every other peer is.

`--topology T.json --node-id ID` makes this peer node ID of T (a skippipe-topology/1 file);
`--node-map M.json` ({"<peer id>": "<node id>", ...}, written by `skippipe-swarm --topology`)
names the nodes of the other peers. A peer whose id is itself a node id needs no map entry.
Links to peers that are not nodes of T are not emulated.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

from protocol.errors import ProtocolError
from protocol.topology import Topology, load_topology

MAX_MAP_BYTES = 16 * 1024 * 1024


class EmulationError(ValueError):
    """The emulation flags cannot be used (the message says why)."""


@dataclass(frozen=True)
class Emulation:
    topology: Topology
    node_id: str
    peers: dict[str, str] = field(default_factory=dict)   # peer id -> node id

    def __post_init__(self):
        ids = set(self.topology.node_ids)
        if self.node_id not in ids:
            raise EmulationError(f"--node-id {self.node_id!r} is not a node of the topology "
                                 f"(nodes: {', '.join(sorted(ids)[:8])}{' ...' if len(ids) > 8 else ''})")
        bad = sorted(n for n in self.peers.values() if n not in ids)
        if bad:
            raise EmulationError(f"node map names unknown node(s): {', '.join(bad[:5])}")

    @property
    def index(self) -> int:
        return self.topology.node_ids.index(self.node_id)

    @property
    def node(self):
        return self.topology.nodes[self.index]

    @property
    def slowdown(self) -> float:
        return self.node.slowdown

    @property
    def max_latency_s(self) -> float:
        """The slowest one-way latency from or to this node (heartbeats must allow twice it)."""
        t, i = self.topology, self.index
        return max([max(t.latency_s(i, j), t.latency_s(j, i)) for j in range(len(t.nodes))], default=0.0)

    def node_of(self, peer: str) -> int | None:
        node = self.peers.get(peer, peer)
        ids = self.topology.node_ids
        return ids.index(node) if node in ids else None

    def links(self, peer: str) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """((latency_s, bytes/s) to `peer`, (latency_s, bytes/s) back), or None: not emulated."""
        j, i, t = self.node_of(peer), self.index, self.topology
        if j is None or j == i:
            return None
        return (t.latency_s(i, j), t.bandwidth_bytes_s(i, j)), (t.latency_s(j, i), t.bandwidth_bytes_s(j, i))

    def describe(self) -> str:
        t, i = self.topology, self.index
        others = [j for j in range(len(t.nodes)) if j != i]
        lat = [t.latency_s(i, j) * 1000 for j in others] or [0.0]
        bw = [t.bandwidth_bytes_s(i, j) / 1e6 for j in others] or [0.0]
        return (f"node {self.node_id} of {len(t.nodes)}: latency {min(lat):.0f}-{max(lat):.0f} ms, "
                f"bandwidth {min(bw):.1f}-{max(bw):.1f} MB/s, compute slowdown x{self.slowdown:g}, "
                f"{len(self.peers)} peers mapped")


def load_node_map(path: str | Path) -> dict[str, str]:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_MAP_BYTES:
            raise EmulationError(f"node map {path} is larger than {MAX_MAP_BYTES} bytes")
        data = json.loads(path.read_text())
    except OSError as exc:
        raise EmulationError(f"cannot read node map {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise EmulationError(f"node map {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise EmulationError(f"node map {path} must be a JSON object of peer id -> node id strings")
    return data


def load_emulation(topology_path: str | Path, node_id: str, node_map_path: str | Path | None = None) -> Emulation:
    try:
        topology = load_topology(topology_path)
    except ProtocolError as exc:
        raise EmulationError(f"--topology {topology_path}: {exc}") from None
    peers = load_node_map(node_map_path) if node_map_path else {}
    return Emulation(topology, node_id, peers)


def emulate(transport, topology_path: Path | None, node_id: str, node_map_path: Path | None):
    """(transport wrapped in the link emulator, Emulation), or (transport, None) when off."""
    if topology_path is None:
        return transport, None
    import logging
    from peer.transport.emulator import EmulatedTransport
    emulation = load_emulation(topology_path, node_id, node_map_path)
    logging.getLogger("skippipe.peer").warning("LINK EMULATION ON (%s): %s", topology_path, emulation.describe())
    return EmulatedTransport(transport, emulation.links), emulation
