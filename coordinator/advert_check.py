"""Which adverts the coordinator plans with: an advert that contradicts the run spec (layer
count, activation size, a layer range outside the model) or claims the impossible (non-finite or
absurd speed, memory or sizes) is left out and logged once per peer, never a reason to stop
planning for everybody else (issue 24)."""
import logging
import math
from dataclasses import dataclass

from modelconfig import ConfigError, spec_model
from protocol.adverts import PeerAdvert
from protocol.messages import RunSpec

logger = logging.getLogger(__name__)

BYTES_PER_FLOAT = 4              # activations travel as float32 (peer/runtime.py)
MAX_BYTES_PER_PARAM = 8          # a share's dtype is at most float64
MAX_FWD_S_PER_LAYER_SAMPLE = 600.0   # 10 minutes per layer and sample: no real device
MAX_MEMORY_BYTES = 1 << 50       # 1 PiB on one peer is a lie
MAX_MEMORY_MICROBATCHES = 1 << 16
# RunSpec.gradient_exchange came with protocol 1.8: an older peer drops the field and steps
# synchronously, so in a delayed run it would part from its replicas
DELAYED_EXCHANGE_SINCE = (1, 8)


@dataclass(frozen=True)
class ModelFacts:
    """What the run spec fixes about every honest peer's advert."""
    num_layers: int
    activation_bytes_per_sample: int
    max_param_bytes_per_layer: int
    max_stage0_extra_bytes: int

    @classmethod
    def of(cls, spec: RunSpec) -> "ModelFacts | None":
        try:
            m = spec_model(spec.model, spec.model_config)
        except (ConfigError, ValueError):
            return None
        per_layer = 4 * m.dim * m.dim + 3 * m.dim * m.ffn_hidden + 2 * m.dim   # an upper bound
        extra = 2 * (max(m.vocab_size, spec.vocab_size) + 64) * m.dim + m.dim   # padded vocabularies too
        return cls(m.n_layers, spec.seq_len * m.dim * BYTES_PER_FLOAT,
                   per_layer * MAX_BYTES_PER_PARAM, extra * MAX_BYTES_PER_PARAM)


def _finite_in(value, low, high) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high


def advert_problem(a: PeerAdvert, spec: RunSpec, facts: ModelFacts | None) -> str | None:
    """Why `a` cannot be planned with under `spec`, or None when it is plausible."""
    if not _finite_in(a.fwd_s_per_layer_sample, 0.0, MAX_FWD_S_PER_LAYER_SAMPLE):
        return f"impossible speed {a.fwd_s_per_layer_sample!r} s per layer and sample"
    if not _finite_in(a.memory_free_bytes, 0, MAX_MEMORY_BYTES):
        return f"impossible free memory {a.memory_free_bytes!r} bytes"
    if not _finite_in(a.memory_microbatches, 1, MAX_MEMORY_MICROBATCHES):
        return f"impossible activation memory of {a.memory_microbatches!r} microbatches"
    if a.num_layers < 1 or a.activation_bytes_per_sample < 1 or a.param_bytes_per_layer < 1 \
            or a.stage0_extra_param_bytes < 0:
        return "model shape missing (layers, activation or parameter sizes)"
    if spec.gradient_exchange != "sync" and tuple(a.protocol_version) < DELAYED_EXCHANGE_SINCE:
        return (f"speaks protocol {'.'.join(map(str, a.protocol_version))}: the run's delayed updates "
                f"(--gradient-exchange) need {'.'.join(map(str, DELAYED_EXCHANGE_SINCE))} or newer")
    if facts is None:
        return None
    if a.num_layers != facts.num_layers:
        return f"claims {a.num_layers} layers; the run's model {spec.model!r} has {facts.num_layers}"
    if a.activation_bytes_per_sample != facts.activation_bytes_per_sample:
        return (f"claims {a.activation_bytes_per_sample} activation bytes per sample; "
                f"the run spec fixes {facts.activation_bytes_per_sample}")
    if a.param_bytes_per_layer > facts.max_param_bytes_per_layer \
            or a.stage0_extra_param_bytes > facts.max_stage0_extra_bytes:
        return "claims parameter sizes beyond the run's model"
    if a.layer_end > facts.num_layers:
        return f"hosts layers [{a.layer_start}, {a.layer_end}) outside the model's {facts.num_layers}"
    return None


class AdvertGate:
    """Filters the adverts of each round; logs each peer's problem once (again only when it
    changes), not every round."""

    LOGGED_KEPT = 4096

    def __init__(self, spec: RunSpec):
        self.spec, self.facts = spec, ModelFacts.of(spec)
        self.ignored: dict[str, str] = {}          # peer id -> why, this round (for the status page)
        self._logged: dict[str, str] = {}

    def admit(self, adverts: dict[str, PeerAdvert]) -> dict[str, PeerAdvert]:
        kept, ignored = {}, {}
        for peer, a in adverts.items():
            problem = advert_problem(a, self.spec, self.facts)
            if problem is None:
                kept[peer] = a
                continue
            ignored[peer] = problem
            if self._logged.get(peer) != problem:
                if len(self._logged) >= self.LOGGED_KEPT:
                    del self._logged[next(iter(self._logged))]
                self._logged[peer] = problem
                logger.warning("ignoring the advert of %s: %s", peer, problem)
        self.ignored = ignored
        return kept
