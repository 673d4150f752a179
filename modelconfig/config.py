"""ModelConfig, the named presets, and the checks every architecture must pass."""
from __future__ import annotations

from dataclasses import dataclass

# Byte-level tokenizer ids 0..255 plus EOS (256), padded up to a multiple of 64.
BYTE_VOCAB_SIZE = 320


class ConfigError(ValueError):
    """A model config that cannot be built; `field` names the offending (config.json) field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class ModelConfig:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int = BYTE_VOCAB_SIZE
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self):
        # Field names in the errors are the config.json names a user would edit.
        for field, hf in (("dim", "hidden_size"), ("n_layers", "num_hidden_layers"),
                          ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
                          ("ffn_hidden", "intermediate_size"), ("vocab_size", "vocab_size"),
                          ("max_seq_len", "max_position_embeddings")):
            value = getattr(self, field)
            if type(value) is not int or value < 1:
                raise ConfigError(hf, f"must be an integer >= 1, got {value!r}")
        if self.dim % self.n_heads:
            raise ConfigError("hidden_size", f"{self.dim} is not divisible by num_attention_heads "
                                             f"{self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError("num_key_value_heads", f"num_attention_heads {self.n_heads} is not "
                                                     f"divisible by {self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ConfigError("hidden_size", f"head dimension {self.dim // self.n_heads} must be even "
                                             "for rotary embeddings")
        for field, hf in (("rope_theta", "rope_theta"), ("norm_eps", "rms_norm_eps"),
                          ("init_std", "initializer_range")):
            value = getattr(self, field)
            if type(value) not in (int, float) or not value > 0 or value == float("inf"):
                raise ConfigError(hf, f"must be a finite number > 0, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (
    ModelConfig("tiny", dim=64, n_layers=6, n_heads=4, n_kv_heads=2, ffn_hidden=176,
                max_seq_len=128),
    ModelConfig("small", dim=128, n_layers=12, n_heads=8, n_kv_heads=2, ffn_hidden=352,
                max_seq_len=256),
    # The paper's LLaMA-style sizes (~0.50B and ~1.49B parameters with our byte vocabulary).
    ModelConfig("500m", dim=1280, n_layers=24, n_heads=20, n_kv_heads=5, ffn_hidden=4352,
                max_seq_len=1024),
    ModelConfig("1.5b", dim=2048, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=5888,
                max_seq_len=1024),
)}


def get_config(name: str) -> ModelConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown model config {name!r}; known: {', '.join(CONFIGS)}") from None
