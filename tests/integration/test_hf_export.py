"""Export: per-stage safetensors checkpoints, written as the peers write them, become a folder
that `transformers` loads, computes the same logits as our model from, tokenizes with our
ids, and generates from (issue 21)."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from modelconfig import CONFIGS, to_spec_json  # noqa: E402
from protocol import messages as m  # noqa: E402
from tokendata.tokenizer import load_tokenizer, padded_vocab_size  # noqa: E402

from peer.compute.model import Decoder, spec_config  # noqa: E402
from peer.compute.runner import StageRunner  # noqa: E402
from peer.hf_cli import main as hf_main  # noqa: E402
from peer.pipeline.checkpoint import CheckpointStore  # noqa: E402

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler — ünïcode too."


def run_spec(tokenizer: str) -> m.RunSpec:
    if tokenizer == "byte":       # the preset, as today's runs name it
        return m.RunSpec(run="hf", model="tiny", num_stages=3, skip_ratio=0.0, seed=11)
    vocab = padded_vocab_size(load_tokenizer(tokenizer).vocab_size)
    cfg = replace(CONFIGS["tiny"], name="tiny-bpe", vocab_size=vocab, n_layers=4)
    return m.RunSpec(run="hf", model=cfg.name, num_stages=3, skip_ratio=0.0, seed=11,
                     model_config=to_spec_json(cfg))


def trained_checkpoint(spec: m.RunSpec, directory, stages=None) -> Decoder:
    """Stages stepped away from their init (so a mix-up of tensors would show), saved as the
    peers save them; returns our full model holding the same weights."""
    store = CheckpointStore(directory, spec.run)
    full = Decoder(spec_config(spec), seed=0)
    state = {}
    gen = torch.Generator().manual_seed(3)
    for s in range(spec.num_stages) if stages is None else stages:
        r = StageRunner.from_spec(spec, s)
        for p in r.module.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        r.samples_this_step = 1
        r.step()
        store.save(r, s, 9)
        state.update(r.module.global_state_dict())
    full.load_state_dict({n.replace("layers.", "layers.blocks.", 1) if n.startswith("layers.") else n: t
                          for n, t in state.items()}, strict=stages is None)
    return full.eval()


def export(checkpoint, out, *extra) -> int:
    flags = {"checkpoint": str(checkpoint), "initial_peers": [], "run": None, "output": str(out),
             "tokenizer": "byte", "max_shard_size": "5GB", "join_key": None}
    for key, value in zip(extra[::2], extra[1::2]):
        flags[key] = value
    return hf_main(["export", json.dumps(flags)])


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_export_loads_in_transformers_with_our_logits_ids_and_generates(tmp_path, tokenizer):
    spec = run_spec(tokenizer)
    ours = trained_checkpoint(spec, tmp_path / "ckpt")
    out = tmp_path / "hf"
    assert export(tmp_path / "ckpt", out, "tokenizer", tokenizer, "max_shard_size", "100KB") == 0
    assert (out / "model.safetensors.index.json").is_file()       # > 100 KB: sharded
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = load_tokenizer(tokenizer)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok.encode(TEXT)
    assert hf_tok(TEXT)["input_ids"] == ids
    assert hf_tok.eos_token_id == tok.eos_id and hf_tok.decode(ids) == TEXT

    tokens = torch.tensor([ids[:32], ids[-32:]])
    with torch.no_grad():
        theirs = hf(tokens).logits
        mine, _ = ours(tokens)
    assert theirs.shape == mine.shape == (2, 32, spec_config(spec).vocab_size)
    assert (theirs - mine).abs().max().item() <= 1e-4

    prompt = torch.tensor([ids[:8]])
    sampled = hf.generate(prompt, max_new_tokens=12, do_sample=True, top_k=0,
                          generator=None, pad_token_id=tok.eos_id)
    assert sampled.shape[1] > 8 and torch.equal(sampled[0, :8], prompt[0])
    assert int(sampled.max()) < tok.vocab_size        # padding rows are suppressed


def test_export_refuses_a_folder_missing_a_stage_and_a_foreign_tokenizer(tmp_path):
    spec = run_spec("byte")
    trained_checkpoint(spec, tmp_path / "ckpt", stages=[0, 2])
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "export", "--checkpoint", str(tmp_path / "ckpt"),
                           "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "lacks stage(s) 1" in proc.stderr and not (tmp_path / "out").exists()

    trained_checkpoint(spec, tmp_path / "ckpt", stages=[1])
    assert export(tmp_path / "ckpt", tmp_path / "out", "tokenizer", "bpe") == 2   # 4096 tokens > 320 rows
    assert not (tmp_path / "out").exists()
