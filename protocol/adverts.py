"""What a peer announces about itself, and what it measured about its links."""
import math
from dataclasses import dataclass
from enum import IntEnum

from protocol.errors import FieldError
from protocol.version import PACKAGE_VERSION, PROTOCOL_VERSION


class PeerState(IntEnum):
    JOINING = 0
    ONLINE = 1
    OFFLINE = 2


STAGE_AUTO = -1
MAX_LATE_PEERS = 16
MAX_PEER_ID_CHARS = 128  # the peer waits for the coordinator to assign it a stage


@dataclass(frozen=True)
class PeerAdvert:
    peer_id: str
    state: PeerState
    device: str                       # "cpu", "cuda:0 (NVIDIA H200)", ...
    memory_free_bytes: int
    fwd_s_per_layer_sample: float     # measured throughput: seconds per layer per sample, forward
    stage: int = STAGE_AUTO           # hosted stage, or STAGE_AUTO while unassigned
    layer_start: int = 0              # hosted layer range [start, end)
    layer_end: int = 0
    memory_microbatches: int = 1      # activations it can hold at once
    maddrs: tuple[str, ...] = ()      # visible multiaddrs, as strings
    public_name: str = ""
    protocol_version: tuple[int, int] = PROTOCOL_VERSION
    package_version: str = PACKAGE_VERSION
    timestamp: float = 0.0
    # Model shape facts the coordinator's planner needs (peers know the model, it does not).
    num_layers: int = 0
    activation_bytes_per_sample: int = 0
    param_bytes_per_layer: int = 0
    stage0_extra_param_bytes: int = 0  # stage 0's embedding, final norm and head, beyond its layers
    member_proof: bytes = b""         # HMAC(join key, run, peer_id) when the run needs a join key
    reachability: str = ""            # the peer's start-up self-test verdict (peer/reachability.py)
    invite_claim: bytes = b""         # protocol/invitations.make_claim, when admitted by invitation
    # v1.7: fwd_s_per_layer_sample as measured while training (0: not yet); the coordinator
    # demotes peers far slower than the swarm by it (coordinator/slow_peers.py)
    measured_fwd_s_per_layer_sample: float = 0.0
    # v1.10: peers that missed one of our hop deadlines lately (peer/pipeline/hop_deadlines.py):
    # the coordinator plans around them for a while (coordinator/slow_peers.py)
    late_peers: tuple[str, ...] = ()

    def __post_init__(self):
        if self.memory_free_bytes < 0:
            raise FieldError("memory_free_bytes", "must be >= 0")
        if self.fwd_s_per_layer_sample < 0:
            raise FieldError("fwd_s_per_layer_sample", "must be >= 0")
        if not (math.isfinite(self.measured_fwd_s_per_layer_sample) and self.measured_fwd_s_per_layer_sample >= 0):
            raise FieldError("measured_fwd_s_per_layer_sample", "must be finite and >= 0")
        if self.stage < STAGE_AUTO:
            raise FieldError("stage", f"must be >= 0 or {STAGE_AUTO} (auto)")
        if not 0 <= self.layer_start <= self.layer_end:
            raise FieldError("layer_end", "layer range must satisfy 0 <= start <= end")
        if self.memory_microbatches < 1:
            raise FieldError("memory_microbatches", "must be >= 1")
        if len(self.late_peers) > MAX_LATE_PEERS or not all(
                isinstance(p, str) and 0 < len(p) <= MAX_PEER_ID_CHARS for p in self.late_peers):
            raise FieldError("late_peers", f"at most {MAX_LATE_PEERS} peer ids of 1-{MAX_PEER_ID_CHARS} characters")
        if len(self.reachability) > 32:
            raise FieldError("reachability", "at most 32 characters")


@dataclass(frozen=True)
class LinkMeasurement:
    peer_id: str                      # the other end
    rtt_ms: float
    bandwidth_bytes_s: float

    def __post_init__(self):
        if self.rtt_ms < 0:
            raise FieldError("rtt_ms", "must be >= 0")
        if self.bandwidth_bytes_s <= 0:
            raise FieldError("bandwidth_bytes_s", "must be > 0")


@dataclass(frozen=True)
class LinkReport:
    """One peer's measurements to the peers it probed; stored under its own DHT subkey."""

    peer_id: str
    links: tuple[LinkMeasurement, ...]
    timestamp: float = 0.0
