"""Compute and communication cost model (seconds), from the profiled numbers of a topology.

- forward of stage s on node n: fwd_s_per_layer_sample * slowdown * layers(s) * microbatch_samples
  (+ overheads.task_s, the fixed cost of one task in the real runtime)
- backward: backward_ratio x forward (+ task_s)
- head + loss on the origin: head_fraction x one layer's forward for the microbatch (+ task_s)
- transfer a -> b: latency + activation_bytes_per_sample * microbatch_samples / bandwidth
  (+ overheads.hop_s; the same bytes for the activation going forward and its gradient back).
  A quantised link (--wire-compression, protocol/quantised.py) carries bytes_per_element / 4 of
  the float32 bytes (for int4 the mean of the activation's min/max blocks and the gradient's
  absmax ones, wire_bytes_per_element) and adds the time to quantise and decode them (QUANTISE_S_PER_BYTE,
  DEQUANTISE_S_PER_BYTE) to the transfer, off the link; `wire` picks the links (choose_codecs)
- replica averaging of a stage: every replica sends its gradients (param_bytes of the stage:
  its layers, plus the embedding and head on stage 0)
  to every other one directly and steps once it has all the others' (it does not wait for the
  acks of its own, peer/pipeline/averaging.py): the slowest pair's bytes / bandwidth + latency
  (+ hop_s); zero for one replica or param_bytes_per_layer=0. With delayed updates
  (Workload.delayed_exchange, RunSpec.gradient_exchange "delayed") a replica steps at the end of
  iteration i with the shares of iteration i - 1, so the exchange is on the critical path only
  where it takes longer than an iteration (steady.py carries it into the next iteration).
- the iteration boundary (coordinator/planner/steady.py): IterationDone notices, the shares
  above, the optimizer step (overheads.step_s_per_param) and the gap between iterations.

`Overheads()` (all zero) is the pure link-and-compute model; LOCAL_SWARM_OVERHEADS are this
implementation's fixed costs in a local swarm (skippipe-swarm), measured (see its comment).
"""
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from protocol.quantised import CODECS, OFFSET_CODECS, WIRE_COMPRESSION, bytes_per_element
from protocol.schedule import LinkCodec, Schedule
from protocol.topology import Topology


@dataclass(frozen=True)
class Overheads:
    """Fixed costs of the real swarm that link and compute profiles do not contain (seconds)."""

    hop_s: float = 0.0              # per request: RPC round trip, (de)serialisation, inbox hand-off
    task_s: float = 0.0             # per compute task: executor hand-off, autograd bookkeeping
    step_s_per_param: float = 0.0   # optimizer step + gradient vector flatten/unflatten
    origin_gap_s: float = 0.0       # stage-0 peers between iterations (the rest of the schedule read)
    peer_gap_s: float = 0.0         # other peers between iterations (the same)

    def __post_init__(self):
        for name, value in vars(self).items():
            if not value >= 0:
                raise ValueError(f"overhead {name} must be >= 0, got {value}")


# The local swarm (skippipe-swarm: 10-12 peer processes, each with its p2pd, on 2 shared cores),
# measured with timing hooks around the worker's tasks and the real RPCs in
# bench/swarm_vs_full.py runs (docs/results.md): a task's wall time averages 8-13 ms where the
# peer benchmark predicts 1-2 ms of compute -> task_s 0.01; a real loopback RPC round trip
# averages 20-30 ms for an activation (median 8-13 ms; 2 ms on an idle box, bench/swarm.py),
# to which the emulator's timers and the hand-offs on a loaded event loop add: hop_s 0.06 was
# the value that, with task_s fixed, best fit the mean iteration times measured in 2 runs x 2
# strategies (all within 12%). Refitted 2026-12-07 once the peers' DHT traffic, a third of the
# box's CPU, was cut (swarmcore/dht/records.py DHT_BEAM): at 0.06 the six legs of a
# bench/compression.py --repeats 3 run measured 10-19% faster than predicted, at 0.03 within
# -1%..+9%; the step plus gradient (un)flattening averages ~12 ms per ~60k parameters -> 2e-7;
# between the step and the next iteration's start (the schedule read, started when the iteration's
# own work ends, peer/pipeline/schedule_book.py BoundaryRead; the origins' progress report goes out
# in the background) stage-0 peers spent a median 4 ms (mean 0.15 s), the others a median 0.19 s
# (mean 0.33 s: the read overlaps no exchange where a stage has one replica), in a 16-iteration
# skippipe run -> 0.05 and 0.2. (Before the read overlapped and the report left the path: 0.12-0.35 s
# and 0.06-0.17 s.)
LOCAL_SWARM_OVERHEADS = Overheads(hop_s=0.03, task_s=0.01, step_s_per_param=2e-7, origin_gap_s=0.05, peer_gap_s=0.2)

# Wire compression (issue 27), per byte of the float32 tensor: peer/compute/quantise.py on one
# CPU thread of the dev box (load ~6.6 on its 2 cores) took 2.3e-9 (int8) and 3.1e-9 (int4) s a
# byte to quantise a 64 KiB activation (the local swarm's), 1.1-1.6e-9 for 1-8 MiB; decoding
# 0.65e-9 and 1.35e-9 at 64 KiB, 0.2-0.6e-9 for 1-8 MiB. The figures: the small tensors'.
QUANTISE_S_PER_BYTE = 2.5e-9
DEQUANTISE_S_PER_BYTE = 1e-9
# auto compresses a link where the float transmission takes longer than this many times the
# forward of a stage at either end (the slower node's view does not matter: the smaller of the
# two), and the bytes saved outweigh the codec's time: int8, and int4 where even int8's
# transmission still dominates so (the slowest links). Both train within their targets since
# int4 activations went min/max (docs/results.md: int8 -0.1%, int4 +1.9% held-out loss on every
# link, 8 seeds); on bench/compression.py's geo bench int8 alone cut the iteration 16-23%.
AUTO_TRANSMISSION_OVER_COMPUTE = 1.0
AUTO_CODECS = ("int8", "int4")       # each chosen over the one before where transmission still dominates


def wire_bytes_per_element(codec: str) -> float:
    """Bytes per element of an activation and its gradient on average: int4 activations travel
    in min/max blocks (an offset per block too; peer/pipeline/wire.py), gradients in absmax ones."""
    return (bytes_per_element(codec, offsets=codec in OFFSET_CODECS) + bytes_per_element(codec)) / 2


def codec_seconds(float_bytes: float) -> float:
    """Quantising at the sender and decoding at the receiver, for `float_bytes` of float32."""
    return float_bytes * (QUANTISE_S_PER_BYTE + DEQUANTISE_S_PER_BYTE)


def choose_codecs(mode: str, float_bytes: float, bandwidth: np.ndarray, stage_fwd: np.ndarray) -> list[list[str]]:
    """codec[a][b] for every directed link ("off": floats). `bandwidth` [n, n] bytes/s,
    `stage_fwd` [n]: a typical stage's forward on each node, seconds. off: none; int8/int4:
    every link between two nodes; auto: AUTO_CODECS where transmission dominates (see above)."""
    if mode not in WIRE_COMPRESSION:
        raise ValueError(f"wire compression must be one of {WIRE_COMPRESSION}, not {mode!r}")
    n = len(stage_fwd)
    out = [["off"] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a == b or mode == "off":
                continue
            if mode in CODECS:
                out[a][b] = mode
                continue
            out[a][b] = _auto_codec(float_bytes / float(bandwidth[a, b]), codec_seconds(float_bytes),
                                    AUTO_TRANSMISSION_OVER_COMPUTE * min(stage_fwd[a], stage_fwd[b]))
    return out


def _auto_codec(floats_s: float, codec_s: float, dominant_s: float) -> str:
    """The codec of a link whose floats take `floats_s` to transmit: the next of AUTO_CODECS
    while the current choice's transmission exceeds `dominant_s` and the next one's transmission
    plus the codec's time `codec_s` is shorter than the current choice's total."""
    choice, transmission, total = "off", floats_s, floats_s
    for codec in AUTO_CODECS:
        packed = floats_s * wire_bytes_per_element(codec) / 4
        if transmission <= dominant_s or packed + codec_s >= total:
            break
        choice, transmission, total = codec, packed, packed + codec_s
    return choice


def schedule_codecs(schedule: Schedule) -> dict[tuple[str, str], str]:
    """(sender, receiver) -> codec of the links a schedule quantises (Schedule.wire)."""
    return {(w.sender, w.receiver): w.codec for w in schedule.wire}


class CostModel:
    def __init__(self, topology: Topology, overheads: Overheads = Overheads(),
                 wire: str | Mapping[tuple[str, str], str] = "off"):
        """`wire`: a --wire-compression mode (choose_codecs picks the links), or the codec of
        each (sender id, receiver id) link that a schedule quantises (schedule_codecs)."""
        w = topology.workload
        self.topology, self.overheads = topology, overheads
        self.num_nodes = len(topology.nodes)
        self.layers = w.layers_per_stage()
        self.index = {node.id: i for i, node in enumerate(topology.nodes)}
        # One layer's forward for one microbatch on each node.
        self.layer_fwd = np.array([n.fwd_s_per_layer_sample * n.slowdown * w.microbatch_samples
                                   for n in topology.nodes])
        fwd = np.outer(self.layer_fwd, np.array(self.layers, dtype=float))   # [node, stage]
        self.fwd = fwd + overheads.task_s
        self.bwd = fwd * w.backward_ratio + overheads.task_s
        self.head = self.layer_fwd * w.head_fraction + overheads.task_s
        self.memory = [n.memory(w) for n in topology.nodes]
        self.bytes = float(w.activation_bytes_per_sample * w.microbatch_samples)
        n = self.num_nodes
        lat = np.array(topology.links.latency_ms, dtype=float).reshape(n, n) / 1000.0
        bw = np.array(topology.links.bandwidth_gib_s, dtype=float).reshape(n, n) * 2**30
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, np.inf)
        self.latency = lat
        self.bandwidth = bw
        self.hop = np.full((n, n), overheads.hop_s)      # fixed cost of a request to another node
        np.fill_diagonal(self.hop, 0.0)
        self.codec = self._codecs(topology, wire)        # [a][b]: "off" or the link's codec
        ratio = np.array([[1.0 if c == "off" else wire_bytes_per_element(c) / 4 for c in row] for row in self.codec])
        self.wire_bytes = self.bytes * ratio             # what a -> b carries for one activation or gradient
        self.codec_s = np.where(ratio < 1.0, codec_seconds(self.bytes), 0.0)
        self.xfer = lat + self.wire_bytes / bw + self.hop + self.codec_s   # activation or gradient, a -> b
        self.xfer_list = self.xfer.tolist()              # plain floats: faster in inner loops
        self.round_trip = self.xfer + self.xfer.T         # activation there, gradient back
        self.round_trip_list = self.round_trip.tolist()
        self.fwd_list = self.fwd.tolist()
        self.bwd_list = self.bwd.tolist()
        self.head_list = self.head.tolist()
        self.param_bytes_per_layer = w.param_bytes_per_layer
        self.stage0_extra_param_bytes = w.stage0_extra_param_bytes
        self.delayed_exchange = w.delayed_exchange

    def _codecs(self, topology: Topology, wire) -> list[list[str]]:
        if isinstance(wire, str):
            stage_fwd = self.fwd.mean(axis=1) if self.fwd.size else np.zeros(self.num_nodes)
            return choose_codecs(wire, self.bytes, self.bandwidth, stage_fwd)
        out = [["off"] * self.num_nodes for _ in range(self.num_nodes)]
        for (a, b), codec in wire.items():
            if a in self.index and b in self.index and a != b:
                out[self.index[a]][self.index[b]] = codec
        return out

    def wire_of(self, schedule: Schedule) -> tuple[LinkCodec, ...]:
        """Schedule.wire: the quantised links the schedule's routes use, each direction (the
        activation one way, its gradient back), the return to the origin included."""
        ids, links = self.topology.node_ids, set()
        for route in schedule.routes:
            peers = [h.peer for h in route.hops] + [route.origin]
            for a, b in zip(peers, peers[1:]):
                links |= {(a, b), (b, a)}
        out = []
        for a, b in sorted(links):
            i, j = self.index.get(a), self.index.get(b)
            if i is not None and j is not None and self.codec[i][j] != "off":
                out.append(LinkCodec(ids[i], ids[j], self.codec[i][j]))
        return tuple(out)

    def transfer(self, a: int, b: int) -> float:
        return self.xfer_list[a][b]

    def transmission(self, a: int, b: int) -> float:
        """Time the bytes occupy the link (without latency or the codec's time)."""
        return 0.0 if a == b else float(self.wire_bytes[a, b]) / float(self.bandwidth[a, b])

    def stage_param_bytes(self, stage: int) -> float:
        extra = self.stage0_extra_param_bytes if stage == 0 and self.param_bytes_per_layer else 0
        return float(self.param_bytes_per_layer * self.layers[stage] + extra)

    def share(self, stage: int, a: int, b: int) -> float:
        """Replica a's gradient share of `stage` arriving at replica b (one request)."""
        if a == b:
            return 0.0
        return (float(self.hop[a, b]) + self.stage_param_bytes(stage) / float(self.bandwidth[a, b])
                + float(self.latency[a, b]))

    def averaging(self, stage: int, replicas: list[int]) -> float:
        """Gradient exchange among `replicas` (node indices) that all start together: the
        slowest share to arrive."""
        if len(replicas) <= 1 or self.stage_param_bytes(stage) == 0:
            return 0.0
        return max(self.share(stage, a, b) for a in replicas for b in replicas if a != b)

    def step(self, stage: int) -> float:
        """Optimizer step of one replica of `stage`."""
        params = self.stage_param_bytes(stage) / 4.0      # float32 parameters
        return self.overheads.step_s_per_param * params
