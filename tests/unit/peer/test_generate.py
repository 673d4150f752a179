"""`skippipe-coordinator generate`: sampling with our own model code from a checkpoint folder or
an exported folder, stages omitted on request, one-line errors for bad flags and prompts."""
import json
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from protocol import messages as m

from peer.compute.model import Decoder, spec_config
from peer.compute.runner import StageRunner
from peer.compute.sampling import StagedModel, filter_top_p, generate
from peer.compute.stage_checkpoint import load_stage_modules
from peer.hf_cli import main as hf_main
from peer.pipeline.checkpoint import CheckpointStore

SPEC = m.RunSpec(run="gen", model="tiny", num_stages=3, skip_ratio=0.0, seed=5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    store = CheckpointStore(folder, "gen")
    for s in range(SPEC.num_stages):
        store.save(StageRunner.from_spec(SPEC, s), s, 0)
    return folder


def flags(checkpoint, **kw):
    base = {"checkpoint": str(checkpoint), "prompt": "To be", "max_new_tokens": 12, "temperature": 0.8,
            "top_p": 0.95, "seed": 0, "omit": 0.0, "run": None, "tokenizer": None, "stages": None}
    return json.dumps({**base, **kw})


def test_staged_model_runs_the_kept_stages_in_order(checkpoint):
    _, stages, _ = load_stage_modules(checkpoint)
    model = StagedModel.from_stages(stages)
    ref = Decoder(spec_config(SPEC), seed=SPEC.seed).eval()
    tokens = torch.randint(0, 257, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model.logits(tokens, [0, 1, 2]), ref(tokens)[0], atol=1e-5)
        h = ref.layers(ref.embed(tokens), 0, 4)               # stage 2 (layers 4..6) left out
        assert torch.allclose(model.logits(tokens, [0, 1]), ref.head(ref.norm(h)), atol=1e-5)
    as_decoder = StagedModel.from_decoder(ref, [s.layer_end for s in stages])
    assert torch.allclose(as_decoder.logits(tokens, [0, 2]), model.logits(tokens, [0, 2]), atol=1e-5)


def test_sampling_is_seeded_greedy_is_argmax_and_padding_never_sampled(checkpoint):
    _, stages, _ = load_stage_modules(checkpoint)
    model = StagedModel.from_stages(stages)
    prompt = list(b"To be")
    a = generate(model, prompt, 20, [0, 1, 2], seed=1, vocab_limit=257)
    assert a == generate(model, prompt, 20, [0, 1, 2], seed=1, vocab_limit=257)
    assert a != generate(model, prompt, 20, [0, 1, 2], seed=2, vocab_limit=257)
    assert max(a) < 257
    greedy = generate(model, prompt, 1, [0, 1, 2], temperature=0, vocab_limit=257)
    assert greedy == [int(model.logits(torch.tensor([prompt]), [0, 1, 2])[0, -1, :257].argmax())]
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert torch.allclose(filter_top_p(probs, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_checkpoint_and_exported_folder_generate_the_same_text(checkpoint, tmp_path, capsys):
    export = {"checkpoint": str(checkpoint), "initial_peers": [], "run": None, "output": str(tmp_path / "hf"),
              "tokenizer": "byte", "max_shard_size": "5GB", "join_key": None}
    assert hf_main(["export", json.dumps(export)]) == 0
    capsys.readouterr()
    assert hf_main(["generate", flags(checkpoint, seed=4)]) == 0
    from_checkpoint = capsys.readouterr().out
    assert hf_main(["generate", flags(tmp_path / "hf", seed=4)]) == 0
    assert capsys.readouterr().out == from_checkpoint and len(from_checkpoint) > 1
    # --omit 0.5 of 2 non-stage-0 stages: one is left out (the export recorded the split)
    assert hf_main(["generate", flags(tmp_path / "hf", seed=4, omit=0.5)]) == 0
    err = capsys.readouterr().err
    assert "omitting stage(s) [" in err and "of 3" in err


def test_a_prompt_the_tokenizer_cannot_encode_is_a_one_line_error(checkpoint, tmp_path, capsys):
    words = Tokenizer(models.WordLevel({"to": 0, "be": 1, "<|endoftext|>": 2, "[UNK]": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "words.json"))
    assert hf_main(["generate", flags(checkpoint, prompt="to be é", tokenizer=str(tmp_path / "words.json"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot encode the prompt" in err
    assert hf_main(["generate", flags(checkpoint, tokenizer="bpe")]) == 2    # 4096 tokens, 320 rows
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not this model's tokenizer" in err


@pytest.mark.parametrize("args,message", [
    (["--top-p", "0"], "--top-p"),
    (["--temperature", "-1"], "--temperature"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--omit", "2"], "--omit"),
    (["--prompt", ""], "--prompt is empty"),
])
def test_bad_flags_exit_2_with_one_line(checkpoint, args, message):
    argv = ["--checkpoint", str(checkpoint), "--prompt", "x", *args]
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "generate", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_generate_cli_prints_a_continuation(checkpoint):
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", "generate", "--checkpoint", str(checkpoint),
                           "--prompt", "To be", "--max-new-tokens", "5", "--omit", "0.5", "--seed", "3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and len(proc.stdout) > 1 and "omitting stage(s)" in proc.stderr
