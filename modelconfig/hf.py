"""Hugging Face LlamaConfig <-> ModelConfig, and `--model NAME|PATH` resolution.

Our decoder is exactly a LlamaForCausalLM (RMSNorm, rotate-half rotary, SwiGLU, GQA, no
biases, untied head), so only the fields below are free; anything in a config.json that
would change the architecture (another activation, biases, rope scaling, tied embeddings) is
refused by name rather than silently ignored.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from dataclasses import replace

from modelconfig.config import BYTE_VOCAB_SIZE, CONFIGS, ConfigError, ModelConfig

# config.json field -> (ModelConfig field, required?)
FIELDS = {
    "hidden_size": ("dim", True),
    "intermediate_size": ("ffn_hidden", True),
    "num_hidden_layers": ("n_layers", True),
    "num_attention_heads": ("n_heads", True),
    "num_key_value_heads": ("n_kv_heads", False),     # default: num_attention_heads (as HF)
    "vocab_size": ("vocab_size", False),
    "max_position_embeddings": ("max_seq_len", False),
    "rope_theta": ("rope_theta", False),
    "rms_norm_eps": ("norm_eps", False),
    "initializer_range": ("init_std", False),
}
INT_FIELDS = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "max_position_embeddings"}
# Fields that are fine only with the value our model implements (None: absent is fine too).
FIXED = {
    "model_type": ("llama",),
    "hidden_act": ("silu",),
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "rope_scaling": (None,),
    "pretraining_tp": (1,),
}


def _number(field: str, value, integer: bool):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, f"expected a number, got {json.dumps(value)}")
    if integer and (not float(value).is_integer() or isinstance(value, float)):
        raise ConfigError(field, f"expected an integer, got {json.dumps(value)}")
    if not math.isfinite(value):
        raise ConfigError(field, f"must be finite, got {value}")
    return int(value) if integer else float(value)


def padded_vocab(n: int, multiple: int = 64) -> int:
    """Embedding rows for a tokenizer of n tokens (as tokendata.padded_vocab_size: 257 -> 320)."""
    return -(-n // multiple) * multiple


def from_hf_dict(data: dict, name: str, tokenizer_vocab: int | None = None) -> ModelConfig:
    """A LlamaConfig-style dict -> ModelConfig; ConfigError names the first bad field.

    The vocab size follows the tokenizer: without vocab_size it is the tokenizer's size padded
    to a multiple of 64 (the byte tokenizer's 320 when none is given); a vocab_size smaller
    than the tokenizer is refused."""
    if not isinstance(data, dict):
        raise ConfigError("<config>", f"expected a JSON object, got {type(data).__name__}")
    for field, allowed in FIXED.items():
        if field in data and data[field] not in allowed:
            raise ConfigError(field, f"{json.dumps(data[field])} is not supported (this model is a Llama "
                                     f"with {field} {json.dumps(allowed[0])})")
    if data.get("tie_word_embeddings", False) is not False:
        raise ConfigError("tie_word_embeddings", "only false is supported: stage 0 trains the LM head "
                                                 "as its own matrix, apart from the embedding")
    if "head_dim" in data and "hidden_size" in data and "num_attention_heads" in data:
        heads = _number("num_attention_heads", data["num_attention_heads"], True)
        if heads >= 1 and data["head_dim"] != _number("hidden_size", data["hidden_size"], True) // heads:
            raise ConfigError("head_dim", f"{json.dumps(data['head_dim'])} must equal hidden_size / "
                                          "num_attention_heads")
    kwargs = {}
    for field, (ours, required) in FIELDS.items():
        if field not in data:
            if required:
                raise ConfigError(field, "missing")
            continue
        kwargs[ours] = _number(field, data[field], field in INT_FIELDS)
    kwargs.setdefault("n_kv_heads", kwargs["n_heads"])
    kwargs.setdefault("vocab_size", padded_vocab(tokenizer_vocab) if tokenizer_vocab else BYTE_VOCAB_SIZE)
    if tokenizer_vocab and kwargs["vocab_size"] < tokenizer_vocab:
        raise ConfigError("vocab_size", f"{kwargs['vocab_size']} is smaller than the tokenizer's "
                                        f"{tokenizer_vocab} tokens")
    return ModelConfig(name=name, **kwargs)


def to_hf_dict(c: ModelConfig, eos_id: int | None = None, bos_id: int | None = None) -> dict:
    """The LlamaForCausalLM config.json of `c` (transformers builds the very same model)."""
    d = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c.dim, "intermediate_size": c.ffn_hidden, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.max_seq_len, "rope_theta": c.rope_theta,
        "rms_norm_eps": c.norm_eps, "initializer_range": c.init_std, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "rope_scaling": None,
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    if eos_id is not None:
        d["eos_token_id"] = eos_id
    if bos_id is not None:
        d["bos_token_id"] = bos_id
    return d


def to_spec_json(c: ModelConfig) -> str:
    """Canonical text of `c` for the run spec: "" for an unmodified preset (older peers know it)."""
    if CONFIGS.get(c.name) == c:
        return ""
    return json.dumps({"name": c.name, **to_hf_dict(c)}, sort_keys=True, separators=(",", ":"))


def spec_model(model: str, model_config: str = "") -> ModelConfig:
    """The run spec's (model, model_config) -> ModelConfig, as every peer builds it."""
    if not model_config:
        if model not in CONFIGS:
            raise ConfigError("model", f"unknown model config {model!r}; known: {', '.join(CONFIGS)}")
        return CONFIGS[model]
    try:
        data = json.loads(model_config)
    except ValueError as exc:
        raise ConfigError("model_config", f"not JSON: {exc}") from None
    return from_hf_dict(data, model)


def resolve_model(text: str, tokenizer_vocab: int | None = None) -> ModelConfig:
    """`--model` value: a preset name, or a path to a config.json (or a folder holding one).
    With the run's tokenizer size, a preset's vocabulary follows it (padded to 64)."""
    if text in CONFIGS:
        c = CONFIGS[text]
        return replace(c, vocab_size=padded_vocab(tokenizer_vocab)) if tokenizer_vocab else c
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        if "/" not in text and not text.endswith(".json"):
            raise ConfigError("--model", f"unknown model config {text!r}: a preset ({', '.join(CONFIGS)}) or a "
                                         "path to a config.json")
        raise ConfigError("--model", f"{path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--model", f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise ConfigError("--model", f"{path} is not JSON: {exc}") from None
    name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    try:
        return from_hf_dict(data, name or "custom", tokenizer_vocab)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"{exc.problem} (in {path})") from None


def model_arg(text: str) -> ModelConfig:
    """argparse `type=` for --model: a bad name or config.json is a one-line usage error, exit 2."""
    import argparse
    try:
        return resolve_model(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_stages(c: ModelConfig, num_stages: int) -> None:
    """Every stage needs at least one layer."""
    if num_stages > c.n_layers:
        raise ConfigError("num_hidden_layers", f"{c.n_layers} layers cannot fill {num_stages} stages")
