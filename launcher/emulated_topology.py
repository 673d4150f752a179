"""`skippipe-swarm --topology T.json`: which peer emulates which node of T, and the planner's
view of that emulated network.

Every peer gets a pre-made identity, so its peer id is known before it starts: the node map
({peer id: node id}) can then be handed to every peer at once, and the coordinator plans with
T's links instead of waiting for the peers' link probes (which measure the same emulated
links, but arrive seconds after the first plan). Compute stays what the peers advertise:
their own benchmark times T's slowdown (peer/runtime.py).
"""
import dataclasses
import json
from pathlib import Path

from protocol.topology import Links, Topology


def make_identity(path: Path) -> str:
    """Create a libp2p RSA key file (mode 0600) for a peer's --identity; returns its peer id."""
    from hivemind.p2p import PeerID
    from hivemind.proto import crypto_pb2
    from hivemind.utils.crypto import RSAPrivateKey
    key = RSAPrivateKey()
    blob = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=False)
    path.write_bytes(blob)
    return PeerID.from_identity(blob).to_base58()


def assign_nodes(topology: Topology, folder: Path) -> tuple[list[tuple[str, Path]], dict[str, str], Path]:
    """One (node id, identity file) per node of `topology`; the node map {peer id: node id},
    also written to folder/node-map.json (returned third)."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes, node_map = [], {}
    for i, node in enumerate(topology.nodes):
        key = folder / f"identity-{i}.key"
        node_map[make_identity(key)] = node.id
        nodes.append((node.id, key))
    path = folder / "node-map.json"
    path.write_text(json.dumps(node_map, indent=1))
    return nodes, node_map, path


def with_emulated_links(planning: Topology, emulated: Topology, node_map: dict[str, str]) -> Topology:
    """`planning` (nodes are peer ids) with the links of `emulated` between mapped peers;
    pairs involving an unmapped peer keep what was measured."""
    index = {n: i for i, n in enumerate(emulated.node_ids)}
    where = [index.get(node_map.get(p, ""), -1) for p in planning.node_ids]
    lat = [list(r) for r in planning.links.latency_ms]
    bw = [list(r) for r in planning.links.bandwidth_gib_s]
    for a, i in enumerate(where):
        for b, j in enumerate(where):
            if a != b and i >= 0 and j >= 0:
                lat[a][b] = emulated.links.latency_ms[i][j] if i != j else 0.0
                bw[a][b] = emulated.links.bandwidth_gib_s[i][j] if i != j else 10.0
    return dataclasses.replace(planning, links=Links(tuple(map(tuple, lat)), tuple(map(tuple, bw))))
