"""Compute and communication cost model (seconds), from the profiled numbers of a topology.

- forward of stage s on node n: fwd_s_per_layer_sample * slowdown * layers(s) * microbatch_samples
- backward: backward_ratio x forward
- head + loss on the origin: head_fraction x one layer's forward for the microbatch
- transfer a -> b: latency + activation_bytes_per_sample * microbatch_samples / bandwidth
  (the same bytes for the activation going forward and its gradient coming back)
- replica averaging of a stage: ring all-reduce, 2 (r-1)/r * param_bytes / slowest ring
  bandwidth + 2 (r-1) x the worst ring latency; zero for one replica or param_bytes_per_layer=0.
"""
import numpy as np

from protocol.topology import Topology


class CostModel:
    def __init__(self, topology: Topology):
        w = topology.workload
        self.topology = topology
        self.num_nodes = len(topology.nodes)
        self.layers = w.layers_per_stage()
        self.index = {node.id: i for i, node in enumerate(topology.nodes)}
        # One layer's forward for one microbatch on each node.
        self.layer_fwd = np.array([n.fwd_s_per_layer_sample * n.slowdown * w.microbatch_samples
                                   for n in topology.nodes])
        self.fwd = np.outer(self.layer_fwd, np.array(self.layers, dtype=float))   # [node, stage]
        self.bwd = self.fwd * w.backward_ratio
        self.head = self.layer_fwd * w.head_fraction
        self.memory = [n.memory(w) for n in topology.nodes]
        self.bytes = float(w.activation_bytes_per_sample * w.microbatch_samples)
        n = self.num_nodes
        lat = np.array(topology.links.latency_ms, dtype=float).reshape(n, n) / 1000.0
        bw = np.array(topology.links.bandwidth_gib_s, dtype=float).reshape(n, n) * 2**30
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, np.inf)
        self.latency = lat
        self.bandwidth = bw
        self.xfer = lat + self.bytes / bw                # activation or gradient, a -> b
        self.xfer_list = self.xfer.tolist()              # plain floats: faster in inner loops
        self.fwd_list = self.fwd.tolist()
        self.bwd_list = self.bwd.tolist()
        self.head_list = self.head.tolist()
        self.param_bytes_per_layer = w.param_bytes_per_layer

    def transfer(self, a: int, b: int) -> float:
        return self.xfer_list[a][b]

    def transmission(self, a: int, b: int) -> float:
        """Time the bytes occupy the link (without latency)."""
        return 0.0 if a == b else self.bytes / float(self.bandwidth[a, b])

    def averaging(self, stage: int, replicas: list[int]) -> float:
        """Ring all-reduce of the stage's parameters among `replicas` (node indices)."""
        r = len(replicas)
        param_bytes = self.param_bytes_per_layer * self.layers[stage]
        if r <= 1 or param_bytes == 0:
            return 0.0
        ring = list(zip(replicas, replicas[1:] + replicas[:1]))
        slowest = min(float(self.bandwidth[a, b]) for a, b in ring)
        worst_latency = max(float(self.latency[a, b]) for a, b in ring)
        return 2.0 * (r - 1) / r * param_bytes / slowest + 2.0 * (r - 1) * worst_latency
