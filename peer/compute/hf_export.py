"""Our stages -> a Hugging Face LlamaForCausalLM folder, and such a folder -> our Decoder.

The decoder is a Llama in all but parameter names: RMSNorm computed in float32, rotary in the
"rotate half" layout (cat(angles, angles), x * cos + rotate_half(x) * sin, exactly as
transformers' apply_rotary_pos_emb), SwiGLU, grouped-query attention, no biases, an untied
head. So q/k rows need no permutation (that is only for interleaved, complex-pair rotary) and
the export is a renaming. The embedding keeps its padded rows (vocab_size is a multiple of
64 above the tokenizer's size): ids are the same on both sides, and generation_config.json
suppresses the padding ids, which no tokenizer emits and no training sample contains.

    OUT/config.json               LlamaForCausalLM (modelconfig.to_hf_dict)
    OUT/model.safetensors         or model-0000i-of-0000n.safetensors + model.safetensors.index.json
    OUT/generation_config.json    eos / pad ids, padded ids suppressed
    OUT/tokenizer.json            tokendata Tokenizer.to_json_str()
    OUT/tokenizer_config.json     PreTrainedTokenizerFast, eos token
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from modelconfig import ModelConfig, from_hf_dict, to_hf_dict
from peer.compute.model import Decoder

# our global name -> transformers' name ({i}: global layer index)
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
STAGE_KEY = "skippipe_stage_layers"


class ExportError(Exception):
    """The export cannot be made or read (one-line message)."""


def to_hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = _LAYER_RE.match(name)
    if not m or m[2] not in _LAYER:
        raise ExportError(f"no Hugging Face name for parameter {name!r}")
    return f"model.layers.{m[1]}.{_LAYER[m[2]]}"


def from_hf_name(name: str) -> str:
    for ours, theirs in _TOP.items():
        if name == theirs:
            return ours
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
    back = {v: k for k, v in _LAYER.items()}
    if not m or m[2] not in back:
        raise ExportError(f"unexpected tensor {name!r} in a Llama checkpoint")
    return f"layers.{m[1]}.{back[m[2]]}"


def stages_state(stages) -> dict[str, torch.Tensor]:
    """Global-named weights of every stage together (embedding / head / norm from stage 0)."""
    state = {}
    for s in stages:
        for name, t in s.global_state_dict().items():
            if name in state:
                raise ExportError(f"parameter {name} is held by two stages")
            state[name] = t.detach().to("cpu", torch.float32).contiguous()
    return state


def parse_size(text: str) -> int:
    """'5GB', '500MB', '100KB', '1000' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB)")
    unit = (m[2] or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    size = int(float(m[1]) * scale)
    if size < 1:
        raise ValueError(f"size must be > 0: {text!r}")
    return size


def write_weights(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int) -> list[str]:
    """One model.safetensors, or shards + index (transformers' layout) when over the limit."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / WEIGHTS), metadata={"format": "pt"})
        return [WEIGHTS]
    names, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        names.append(fname)
        weight_map.update({n: fname for n in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return names + [INDEX]


def tokenizer_files(tokenizer, config: ModelConfig) -> dict[str, str]:
    if tokenizer.vocab_size > config.vocab_size:
        raise ExportError(f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens, more than the "
                          f"model's vocab_size {config.vocab_size}: it belongs to another model")
    tok_config = tokenizer.hf_config(model_max_length=config.max_seq_len)
    generation = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.eos_id,
                  # rows past the tokenizer's vocabulary: padding, never a real token
                  "suppress_tokens": list(range(tokenizer.vocab_size, config.vocab_size)) or None}
    return {"tokenizer.json": tokenizer.to_json_str(), "tokenizer_config.json": json.dumps(tok_config, indent=2),
            "generation_config.json": json.dumps({k: v for k, v in generation.items() if v is not None}, indent=2)}


def write_hf_folder(stages, tokenizer, out: Path, max_shard_bytes: int = 5 * 10**9) -> list[str]:
    """Write OUT atomically (a temp folder renamed into place); returns the file names.

    config.json also records the stage split (skippipe_stage_layers: each stage's last layer
    + 1), which transformers ignores and `generate --omit` uses."""
    config: ModelConfig = stages[0].config
    tensors = {to_hf_name(n): t for n, t in stages_state(stages).items()}
    files = tokenizer_files(tokenizer, config)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"-o {out} exists and is not an empty folder")
    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        hf = {**to_hf_dict(config, eos_id=tokenizer.eos_id), STAGE_KEY: [s.layer_end for s in stages]}
        (tmp / "config.json").write_text(json.dumps(hf, indent=2))
        written = ["config.json", *write_weights(tensors, tmp, max_shard_bytes)]
        for name, text in files.items():
            (tmp / name).write_text(text)
            written.append(name)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(written)


def layer_split(n_layers: int, num_stages: int) -> list[int]:
    """Each stage's end layer for an even split, as the swarm would cut the model."""
    from peer.compute.stages import layer_ranges
    try:
        return [end for _, end in layer_ranges(n_layers, num_stages)]
    except ValueError as exc:
        raise ExportError(f"--stages: {exc}") from None


def is_hf_folder(path: Path) -> bool:
    return (Path(path) / "config.json").is_file() and (
        (Path(path) / WEIGHTS).is_file() or (Path(path) / INDEX).is_file())


def load_hf_folder(path: Path) -> tuple[Decoder, list[int]]:
    """An exported (or any matching Llama) folder -> (our Decoder, its stage split or [])."""
    from safetensors.torch import load_file
    path = Path(path)
    try:
        data = json.loads((path / "config.json").read_text())
        config = from_hf_dict(data, path.name or "model")
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path / 'config.json'}: {exc}") from None
    split = data.get(STAGE_KEY) or []
    if split and (not all(isinstance(e, int) for e in split) or split != sorted(set(split))
                  or split[-1] != config.n_layers or split[0] < 1):
        raise ExportError(f"{path / 'config.json'}: {STAGE_KEY} {split} does not split {config.n_layers} layers")
    if (path / INDEX).is_file():
        try:
            shard_names = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise ExportError(f"{path / INDEX}: not a safetensors index ({exc})") from None
    else:
        shard_names = [WEIGHTS]
    state = {}
    for name in shard_names:
        try:
            state.update({from_hf_name(k): v for k, v in load_file(str(path / name)).items()})
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"{path / name} cannot be read: {exc}") from None
    model = Decoder(config, seed=0)
    local = {n.replace("layers.", "layers.blocks.", 1) if n.startswith("layers.") else n: t
             for n, t in state.items()}
    try:
        model.load_state_dict(local, strict=True)
    except RuntimeError as exc:
        raise ExportError(f"{path} does not match its config.json: {str(exc).splitlines()[0]}") from None
    return model.eval(), split


__all__ = ["ExportError", "is_hf_folder", "load_hf_folder", "parse_size", "write_hf_folder"]
