"""Synthetic heterogeneous topologies (pure; the RNG is passed in).

- geo: nodes spread round-robin over 12 cloud regions; RTT from great-circle distance
  (fibre ~200 km/ms, x1.6 for routing, + 2 ms), clipped to 1-300 ms; inter-region bandwidth
  falls with distance from ~2 to ~0.08 Gbit/s; within a region 1 ms and 10 Gbit/s.
- clusters: a few fast clusters (1 ms, 10 Gbit/s) joined by slow links (30-150 ms, 0.1-0.5 Gbit/s).
- single: one cluster (0.5-1 ms, 10 Gbit/s).
Compute is heterogeneous: fwd_s_per_layer_sample uniform in [0.02, 0.08] s.
"""
import math
import random

from protocol.topology import TOPOLOGY_FORMAT, Links, Node, Topology, Workload

PRESETS = ("geo", "clusters", "single")
REGIONS = (  # name, latitude, longitude
    ("belgium", 50.8, 4.4), ("virginia", 38.9, -77.4), ("oregon", 45.6, -121.2),
    ("tokyo", 35.7, 139.7), ("sydney", -33.9, 151.2), ("saopaulo", -23.5, -46.6),
    ("mumbai", 19.1, 72.9), ("frankfurt", 50.1, 8.7), ("london", 51.5, -0.1),
    ("singapore", 1.35, 103.8), ("iowa", 41.9, -93.1), ("seoul", 37.6, 127.0),
)
GBIT_TO_GIB = 1e9 / 8 / 2**30


def _km(a, b) -> float:
    (_, la1, lo1), (_, la2, lo2) = a, b
    p1, p2, dl = math.radians(la1), math.radians(la2), math.radians(lo2 - lo1)
    c = math.sin(p1) * math.sin(p2) + math.cos(p1) * math.cos(p2) * math.cos(dl)
    return 6371.0 * math.acos(max(-1.0, min(1.0, c)))


def _geo_link(ra, rb, rng: random.Random) -> tuple[float, float]:
    """(RTT ms, Gbit/s) between two regions."""
    if ra == rb:
        return 1.0, 10.0
    d = _km(ra, rb)
    rtt = min(300.0, max(1.0, (2.0 * d / 200.0 * 1.6 + 2.0) * rng.uniform(0.95, 1.05)))
    gbit = max(0.08, min(2.0, 2.0 * math.exp(-d / 3000.0))) * rng.uniform(0.85, 1.15)
    return rtt, gbit


def _symmetric(n: int, link) -> Links:
    lat = [[0.0] * n for _ in range(n)]
    bw = [[10.0 * GBIT_TO_GIB] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            rtt, gbit = link(i, j)
            lat[i][j] = lat[j][i] = round(rtt, 3)
            bw[i][j] = bw[j][i] = round(gbit * GBIT_TO_GIB, 6)
    return Links(tuple(map(tuple, lat)), tuple(map(tuple, bw)))


def make_topology(preset: str, nodes: int, rng: random.Random, stages: int = 6, layers: int = 24,
                  microbatch_samples: int = 8, microbatches: int = 6,
                  activation_bytes: int = 4 * 2**20, memory: int = 3,
                  param_bytes_per_layer: int = 0, clusters: int = 0) -> Topology:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    workload = Workload(layers, stages, microbatch_samples, microbatches, activation_bytes, memory,
                        param_bytes_per_layer=param_bytes_per_layer)
    if preset == "geo":
        order = list(REGIONS)
        rng.shuffle(order)
        where = [order[i % len(order)] for i in range(nodes)]
        pair = {}

        def link(i, j):
            key = tuple(sorted((where[i][0], where[j][0])))
            if key not in pair:       # one draw per region pair: nodes of a region share links
                pair[key] = _geo_link(where[i], where[j], rng)
            return pair[key]
        names = [w[0] for w in where]
    else:
        k = 1 if preset == "single" else (clusters or max(2, min(6, round(nodes / 6))))
        names = [f"cluster{i % k}" for i in range(nodes)]
        inter = {}

        def link(i, j):
            a, b = sorted((names[i], names[j]))
            if a == b:
                return rng.uniform(0.5, 1.0), 10.0
            if (a, b) not in inter:
                inter[(a, b)] = (rng.uniform(30.0, 150.0), rng.uniform(0.1, 0.5))
            return inter[(a, b)]
    links = _symmetric(nodes, link)
    node_list = tuple(Node(f"{names[i]}-{i}", round(rng.uniform(0.02, 0.08), 4), names[i]) for i in range(nodes))
    return Topology(TOPOLOGY_FORMAT, workload, node_list, links)
