"""Model architectures by name or by Hugging Face `config.json` (torch-free, stdlib only).

Both sides need this: the coordinator validates `--model` before anything starts and puts the
whole architecture into the run spec (so a peer without the file builds the same model), the
peers build their stage from it, and export writes it back as a LlamaForCausalLM config.

`--model` is a preset name (tiny, small, 500m, 1.5b) or a path to a `config.json` (or a folder
holding one) with LlamaConfig fields; see hf.py for the mapping and its checks.
"""
from modelconfig.config import BYTE_VOCAB_SIZE, CONFIGS, ConfigError, ModelConfig, get_config
from modelconfig.hf import (check_stages, from_hf_dict, model_arg, resolve_model, spec_model, to_hf_dict,
                            to_spec_json)

__all__ = ["BYTE_VOCAB_SIZE", "CONFIGS", "ConfigError", "ModelConfig", "get_config", "check_stages", "from_hf_dict", "model_arg",
           "resolve_model", "spec_model", "to_hf_dict", "to_spec_json"]
