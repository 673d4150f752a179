"""The topology file `skippipe-topology/1` (JSON), read by the planner, simulator and the
link emulator. See docs/architecture.md, "Topology file", for the field reference.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import FieldError, TopologyError
from protocol.plain import from_plain, to_plain

TOPOLOGY_FORMAT = "skippipe-topology/1"
MAX_TOPOLOGY_BYTES = 64 * 1024 * 1024


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise FieldError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")


@dataclass(frozen=True)
class Workload:
    num_layers: int
    num_stages: int
    microbatch_samples: int
    microbatches_per_data_node: int
    activation_bytes_per_sample: int
    memory_microbatches: int                  # default per-node limit (TC1)
    stage_sizes: tuple[int, ...] = ()         # layers per stage; () = even split
    backward_ratio: float = 1.5               # backward time / forward time
    head_fraction: float = 0.25               # head + loss time / one layer's forward (per sample)
    param_bytes_per_layer: int = 0            # for the replica-averaging cost; 0 = ignore
    stage0_extra_param_bytes: int = 0         # stage 0's embedding + head, beyond its layers
    global_batch: int = 0                     # microbatches per iteration, split among the data nodes
                                              # by speed; 0 = microbatches_per_data_node each
    delayed_exchange: bool = False            # RunSpec.gradient_exchange == "delayed": the replicas'
                                              # exchange overlaps the next iteration (planner/steady.py)

    def __post_init__(self):
        for name in ("num_layers", "num_stages", "microbatch_samples",
                     "microbatches_per_data_node", "memory_microbatches"):
            _positive(name, getattr(self, name))
        _positive("activation_bytes_per_sample", self.activation_bytes_per_sample, allow_zero=True)
        _positive("param_bytes_per_layer", self.param_bytes_per_layer, allow_zero=True)
        _positive("stage0_extra_param_bytes", self.stage0_extra_param_bytes, allow_zero=True)
        _positive("global_batch", self.global_batch, allow_zero=True)
        _positive("backward_ratio", self.backward_ratio)
        _positive("head_fraction", self.head_fraction, allow_zero=True)
        if self.num_stages > self.num_layers:
            raise FieldError("num_stages", f"{self.num_stages} stages but only {self.num_layers} layers")
        if self.stage_sizes:
            if len(self.stage_sizes) != self.num_stages:
                raise FieldError("stage_sizes", f"{len(self.stage_sizes)} entries for {self.num_stages} stages")
            if any(s < 1 for s in self.stage_sizes):
                raise FieldError("stage_sizes", "every stage needs at least one layer")
            if sum(self.stage_sizes) != self.num_layers:
                raise FieldError("stage_sizes", f"sums to {sum(self.stage_sizes)}, not num_layers={self.num_layers}")

    def layers_per_stage(self) -> tuple[int, ...]:
        if self.stage_sizes:
            return self.stage_sizes
        # Extra layers go to the last stages (stage 0 also carries embedding and head);
        # peer/compute/stages.layer_ranges splits the same way.
        base, extra = divmod(self.num_layers, self.num_stages)
        return tuple(base + (1 if s >= self.num_stages - extra else 0) for s in range(self.num_stages))


@dataclass(frozen=True)
class Node:
    id: str
    fwd_s_per_layer_sample: float
    location: str = ""
    memory_microbatches: int = 0              # 0 = the workload's default
    slowdown: float = 1.0                     # compute slowdown factor (emulated heterogeneity)
    stage: int = -1                           # pinned stage, or -1 to let the planner choose

    def __post_init__(self):
        if not self.id:
            raise FieldError("id", "must not be empty")
        _positive("fwd_s_per_layer_sample", self.fwd_s_per_layer_sample)
        _positive("memory_microbatches", self.memory_microbatches, allow_zero=True)
        _positive("slowdown", self.slowdown)
        if self.stage < -1:
            raise FieldError("stage", f"must be >= 0 or -1 (planner chooses), got {self.stage}")

    def memory(self, workload: Workload) -> int:
        return self.memory_microbatches or workload.memory_microbatches


@dataclass(frozen=True)
class Links:
    latency_ms: tuple[tuple[float, ...], ...]
    bandwidth_gib_s: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class Topology:
    format: str
    workload: Workload
    nodes: tuple[Node, ...]
    links: Links

    def __post_init__(self):
        if self.format != TOPOLOGY_FORMAT:
            raise FieldError("format", f"unknown format {self.format!r}, expected {TOPOLOGY_FORMAT!r}")
        n = len(self.nodes)
        if n == 0:
            raise FieldError("nodes", "at least one node is needed")
        ids = [node.id for node in self.nodes]
        if len(set(ids)) != n:
            raise FieldError("nodes", "node ids must be unique")
        for s, node in enumerate(self.nodes):
            if node.stage >= self.workload.num_stages:
                raise FieldError(f"nodes[{s}].stage", f"stage {node.stage} does not exist")
        for name in ("latency_ms", "bandwidth_gib_s"):
            matrix = getattr(self.links, name)
            if len(matrix) != n:
                raise FieldError(f"links.{name}", f"has {len(matrix)} rows for {n} nodes")
            for i, row in enumerate(matrix):
                if len(row) != n:
                    raise FieldError(f"links.{name}[{i}]", f"has {len(row)} entries for {n} nodes")
                for j, v in enumerate(row):
                    if i != j and (v < 0 or (name == "bandwidth_gib_s" and v == 0)):
                        raise FieldError(f"links.{name}[{i}][{j}]",
                                         f"must be {'> 0' if name == 'bandwidth_gib_s' else '>= 0'}, got {v}")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(node.id for node in self.nodes)

    def latency_s(self, i: int, j: int) -> float:
        return 0.0 if i == j else self.links.latency_ms[i][j] / 1000.0

    def bandwidth_bytes_s(self, i: int, j: int) -> float:
        return math.inf if i == j else self.links.bandwidth_gib_s[i][j] * 2**30


def parse_topology(data: object) -> Topology:
    """Validate plain JSON data; raises TopologyError naming the field."""
    try:
        return from_plain(Topology, data, "")
    except FieldError as exc:
        raise TopologyError(exc.field, exc.problem) from None


def load_topology(path: str | Path) -> Topology:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TOPOLOGY_BYTES:
            raise TopologyError("<file>", f"{path} is larger than {MAX_TOPOLOGY_BYTES} bytes")
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TopologyError("<file>", f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise TopologyError("<file>", f"{path} is not valid JSON: {exc}") from None
    return parse_topology(data)


def topology_to_json(topology: Topology) -> str:
    return json.dumps(to_plain(topology), indent=1)
