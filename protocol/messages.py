"""Control and data-plane messages (frozen dataclasses; the codec gives each a fixed code)."""
import math
from dataclasses import dataclass

from protocol.errors import ErrorCode, FieldError
from protocol.ids import check_run_name
from protocol.quantised import Quantised
from protocol.schedule import Route
from protocol.tensors import TensorChunk, TensorPayload


MAX_LEARNING_RATE = 1.0     # Adam(W) above this diverges on any model: a forged or mistyped spec


GRADIENT_EXCHANGES = ("sync", "delayed")     # RunSpec.gradient_exchange


@dataclass(frozen=True)
class RunSpec:
    """Written by the coordinator: everything a peer needs to build its stage and train."""

    run: str
    model: str                       # named model config, e.g. "tiny"
    num_stages: int
    skip_ratio: float
    seed: int = 0
    microbatch_samples: int = 4
    seq_len: int = 64
    microbatches_per_origin: int = 4
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    stage_sizes: tuple[int, ...] = ()  # layers per stage; () = as even as possible
    max_steps: int = 0               # iterations to train; 0 = until stopped
    # v1.3: the whole architecture as canonical LlamaConfig-style JSON (modelconfig.to_spec_json),
    # so that peers without the coordinator's config.json build the same model; "" = the preset `model`.
    model_config: str = ""
    # v1.3: the data the run trains on. A stage-0 peer refuses any other.
    tokenizer: str = "byte"          # "byte", "bpe" (shipped) or a tokenizer file's name
    tokenizer_hash: str = ""         # sha256 of the tokenizer.json ("" = the byte tokenizer)
    dataset_id: str = ""             # the dataset manifest's id ("" = the embedded corpus)
    vocab_size: int = 0              # ids the tokenizer emits (0 = the byte tokenizer's 257)
    # v1.4: microbatches per iteration, split among the data nodes by speed; churn changes who
    # computes them, never how many (0 = microbatches_per_origin on every data node)
    global_batch: int = 0
    # v1.8: when the replicas' averaged gradients are applied: "sync" at the end of their own
    # iteration (the exchange on the critical path), "delayed" one iteration later (the exchange
    # overlaps the next iteration's work; peer/pipeline/averaging.py). Absent (an older
    # coordinator): sync, what every peer before 1.8 does.
    gradient_exchange: str = "sync"

    def __post_init__(self):
        check_run_name(self.run)
        if self.gradient_exchange not in GRADIENT_EXCHANGES:
            raise FieldError("gradient_exchange", f"must be one of {', '.join(GRADIENT_EXCHANGES)}")
        if self.num_stages < 1:
            raise FieldError("num_stages", "must be >= 1")
        if not 0.0 <= self.skip_ratio < 1.0:
            raise FieldError("skip_ratio", "must be in [0, 1)")
        for name in ("microbatch_samples", "seq_len", "microbatches_per_origin"):
            if getattr(self, name) < 1:
                raise FieldError(name, "must be >= 1")
        if self.stage_sizes and len(self.stage_sizes) != self.num_stages:
            raise FieldError("stage_sizes", f"needs {self.num_stages} entries")
        if not 0 <= self.vocab_size <= 1 << 22:
            raise FieldError("vocab_size", "must be in [0, 4194304]")
        # values that decode fine but would wreck training: a spec read from the DHT is refused
        # with these, whoever wrote it (a negative rate trains away from the data; no clipping
        # lets one bad microbatch blow the weights up)
        if not (math.isfinite(self.learning_rate) and 0.0 < self.learning_rate <= MAX_LEARNING_RATE):
            raise FieldError("learning_rate", f"must be in (0, {MAX_LEARNING_RATE:g}]")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0.0):
            raise FieldError("max_grad_norm", "must be a finite number > 0 (the run spec cannot turn clipping off)")
        for name in ("warmup_steps", "max_steps", "global_batch"):
            if getattr(self, name) < 0:
                raise FieldError(name, "must be >= 0")


@dataclass(frozen=True)
class WorkHeader:
    """Identifies one hop of one microbatch's forward or backward pass."""

    run: str
    epoch: int
    iteration: int
    microbatch_id: int
    hop_index: int                   # index into the route's hops; len(hops) = back at origin
    # Recovery (v1.1): a microbatch re-sent after a failure carries a higher attempt and the
    # route it actually takes (a replica swapped in, a stage skipped, or a fresh route).
    attempt: int = 0
    route: Route | None = None       # None: the schedule's planned route

    def __post_init__(self):
        check_run_name(self.run)
        for name in ("epoch", "iteration", "microbatch_id", "hop_index", "attempt"):
            if getattr(self, name) < 0:
                raise FieldError(name, "must be >= 0")
        if self.route is not None and self.route.microbatch_id != self.microbatch_id:
            raise FieldError("route", "belongs to another microbatch")


@dataclass(frozen=True)
class ForwardRequest:
    header: WorkHeader
    tensor: TensorPayload
    # v1.6: set when `tensor` is quantised (protocol/quantised.py: checked by `split` on arrival,
    # not here: a streamed request's head carries an empty placeholder tensor)
    quantised: Quantised | None = None


@dataclass(frozen=True)
class ForwardReply:
    header: WorkHeader
    tensor: TensorPayload | None = None


@dataclass(frozen=True)
class BackwardRequest:
    header: WorkHeader
    tensor: TensorPayload
    # v1.6: set when `tensor` is quantised (protocol/quantised.py: checked by `split` on arrival,
    # not here: a streamed request's head carries an empty placeholder tensor)
    quantised: Quantised | None = None


@dataclass(frozen=True)
class BackwardReply:
    header: WorkHeader
    tensor: TensorPayload | None = None


@dataclass(frozen=True)
class StreamHead:
    """First frame of a streamed (chunked) request: the encoded request whose `tensor` is an
    empty placeholder; TensorChunk frames with the real tensor follow."""

    message: bytes


@dataclass(frozen=True)
class StreamChunk:
    chunk: TensorChunk


@dataclass(frozen=True)
class ErrorReply:
    code: ErrorCode
    message: str
    detail: str = ""


@dataclass(frozen=True)
class Ping:
    nonce: int
    payload: bytes = b""             # padding for bandwidth probes


@dataclass(frozen=True)
class Pong:
    nonce: int
    payload: bytes = b""


SHARE_DTYPES = ("float32", "float16", "int8")   # what a GradientShare's tensor may be
SHARE_BLOCK = 64       # parameters per float32 scale of an int8 GradientShare


@dataclass(frozen=True)
class GradientShare:
    """One replica's summed gradients for a stage, sent to the stage's other replicas.
    `tensor` is float32, float16 or int8; an int8 one holds blockwise-quantised values and
    `scales` (float32, one per SHARE_BLOCK parameters) turns them back: value x its block's scale."""

    run: str
    epoch: int
    iteration: int
    stage: int
    samples: int                     # samples whose gradients are in the sum
    tensor: TensorPayload
    loss_sum: float = 0.0            # stage 0 only: sum of per-sample losses
    scales: TensorPayload | None = None   # int8 tensor only (protocol 1.2)


@dataclass(frozen=True)
class GradientShareAck:
    iteration: int


@dataclass(frozen=True)
class MicrobatchCounts:
    completed: int = 0
    rerouted: int = 0
    skipped_stage: int = 0
    reissued: int = 0
    lost: int = 0


@dataclass(frozen=True)
class IterationDone:
    """Sent by a stage-0 peer to every peer of the schedule once all its microbatches of
    `iteration` have ended (completed, recovered or lost): no more work of it will come."""

    run: str
    epoch: int
    iteration: int
    counts: MicrobatchCounts = MicrobatchCounts()


@dataclass(frozen=True)
class MicrobatchFailed:
    """Sent to a microbatch's origin by a hop that could neither reroute nor skip: please
    re-issue it on a fresh route (or count it lost)."""

    header: WorkHeader
    dead_peer: str
    reason: str = ""


@dataclass(frozen=True)
class Ack:
    """Reply to IterationDone and MicrobatchFailed."""

    iteration: int


@dataclass(frozen=True)
class StateRequest:
    """Late join: a new replica of `stage` asks a live one for the stage's training state as
    it is after iteration `iteration - 1` (so it can train iteration `iteration` with it), one
    chunk of at most `max_elements` floats from `offset` at a time."""

    run: str
    stage: int
    iteration: int
    offset: int = 0
    max_elements: int = 1 << 19

    def __post_init__(self):
        check_run_name(self.run)
        for name in ("stage", "iteration", "offset"):
            if getattr(self, name) < 0:
                raise FieldError(name, "must be >= 0")
        if not 1 <= self.max_elements <= 1 << 20:
            raise FieldError("max_elements", "must be in [1, 2**20]")


@dataclass(frozen=True)
class StateReply:
    stage: int
    iteration: int
    total_elements: int               # of the whole flat state vector
    offset: int
    step_count: int                   # optimizer steps taken (warm-up position)
    adam_step: int
    tensor: TensorPayload             # float32 elements [offset, offset + len)
    # v1.8 (gradient_exchange "delayed"): the iteration whose averaged update the donor has not
    # applied yet (-1: none); the joiner takes part in it (a zero share of its own)
    pending: int = -1


@dataclass(frozen=True)
class WeightsRequest:
    """Export (v1.3): a reader of a live run (`skippipe-coordinator export --initial-peers`)
    asks a replica of `stage` for its current parameters, one chunk at a time. The first
    request (offset 0, snapshot 0) makes the replica take a snapshot; the others name it, so
    every chunk comes from the same weights while training goes on."""

    run: str
    stage: int
    snapshot: int = 0                 # 0: take a new one; else the id the first reply gave
    offset: int = 0
    max_elements: int = 1 << 19

    def __post_init__(self):
        check_run_name(self.run)
        for name in ("stage", "snapshot", "offset"):
            if getattr(self, name) < 0:
                raise FieldError(name, "must be >= 0")
        if not 1 <= self.max_elements <= 1 << 20:
            raise FieldError("max_elements", "must be in [1, 2**20]")


@dataclass(frozen=True)
class WeightsReply:
    stage: int
    snapshot: int
    iteration: int                    # the last iteration whose step the weights include (-1: none)
    layer_start: int
    layer_end: int
    total_elements: int               # parameters of the stage, in its parameter order
    offset: int
    tensor: TensorPayload             # float32 elements [offset, offset + len)


@dataclass(frozen=True)
class IterationReport:
    """Published by each stage-0 peer after each iteration (DHT progress key, own subkey)."""

    peer_id: str
    epoch: int
    iteration: int
    loss_sum: float
    samples: int
    tokens: int
    started_at: float
    finished_at: float
    counts: MicrobatchCounts
    stages_visited: int = 0          # total (microbatch, stage) visits, for skip statistics
    # v1.3: global sample positions trained, as (start, count) pairs, and microbatches lost
    positions: tuple[int, ...] = ()
    lost_microbatches: tuple[int, ...] = ()
    # v1.9: microbatches that completed on their planned route, and the seconds from sending
    # each one's first forward to its gradient's return: the coordinator's witness of the
    # speed of the peers on those routes (coordinator/witnessed_speed.py)
    timed_microbatches: tuple[int, ...] = ()
    round_trip_s: tuple[float, ...] = ()

    def __post_init__(self):
        if len(self.timed_microbatches) != len(self.round_trip_s):
            raise FieldError("round_trip_s", "needs one figure per timed microbatch")
        if len(self.round_trip_s) > MAX_TIMED_MICROBATCHES:
            raise FieldError("round_trip_s", f"at most {MAX_TIMED_MICROBATCHES} microbatches are timed")
        if not all(math.isfinite(s) and 0 <= s <= MAX_ROUND_TRIP_S for s in self.round_trip_s):
            raise FieldError("round_trip_s", f"must be finite, within 0-{MAX_ROUND_TRIP_S:.0f} s")


MAX_TIMED_MICROBATCHES = 64     # an origin's microbatches in one iteration (the spec allows 64)
MAX_ROUND_TRIP_S = 3600.0


@dataclass(frozen=True)
class ProgressRecord:
    """A stage-0 peer's most recent iteration reports (several, so a slow reader misses none)."""

    peer_id: str
    reports: tuple[IterationReport, ...]
    # v1.7: when the peer stored it (its wall clock), re-stored every few seconds even while no
    # iteration ends: a stalled swarm shows as fresh records with old iterations (0: unknown)
    written_at: float = 0.0

    def __post_init__(self):
        if not (math.isfinite(self.written_at) and self.written_at >= 0):
            raise FieldError("written_at", "must be finite and >= 0")


DATA_CHUNK_BYTES = 1 << 20           # one DataReply carries at most this much of a file


@dataclass(frozen=True)
class DataRequest:
    """v1.3: a volunteer asks a holder of dataset `dataset_id` for `length` bytes of one of its
    files ("dataset.json" or a shard the manifest lists) from `offset`."""

    dataset_id: str
    file: str
    offset: int = 0
    length: int = DATA_CHUNK_BYTES

    def __post_init__(self):
        if not self.dataset_id or len(self.dataset_id) > 128:
            raise FieldError("dataset_id", "must be 1-128 characters")
        if not self.file or len(self.file) > 255 or "/" in self.file or "\\" in self.file or self.file.startswith("."):
            raise FieldError("file", "must be a plain file name of the dataset")
        if self.offset < 0:
            raise FieldError("offset", "must be >= 0")
        if not 1 <= self.length <= DATA_CHUNK_BYTES:
            raise FieldError("length", f"must be in [1, {DATA_CHUNK_BYTES}]")


@dataclass(frozen=True)
class DataReply:
    data: bytes
    total_bytes: int                 # the file's size, so the client knows when it is done

    def __post_init__(self):
        if len(self.data) > DATA_CHUNK_BYTES:
            raise FieldError("data", f"at most {DATA_CHUNK_BYTES} bytes per reply")
        if self.total_bytes < 0:
            raise FieldError("total_bytes", "must be >= 0")
