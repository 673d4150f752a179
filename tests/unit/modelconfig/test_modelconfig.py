"""--model NAME|config.json: parsing, one-line errors naming the field, the run spec round trip."""
import json
import subprocess
import sys

import pytest

from modelconfig import CONFIGS, ConfigError, from_hf_dict, resolve_model, spec_model, to_hf_dict, to_spec_json
from protocol import codec
from protocol.messages import RunSpec

GOOD = {"hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 3, "num_attention_heads": 6,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "max_position_embeddings": 64,
        "vocab_size": 384, "tie_word_embeddings": False, "model_type": "llama", "hidden_act": "silu"}


def test_config_json_maps_to_the_model_config(tmp_path):
    folder = tmp_path / "mini"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GOOD))
    c = resolve_model(str(folder))
    assert (c.name, c.dim, c.ffn_hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.norm_eps, c.rope_theta,
            c.max_seq_len, c.vocab_size) == ("mini", 96, 200, 3, 6, 2, 1e-6, 500000.0, 64, 384)
    assert resolve_model(str(folder / "config.json")) == c
    # written back as a LlamaConfig, it reads as the same architecture
    assert from_hf_dict(to_hf_dict(c), "mini") == c
    assert resolve_model("tiny") is CONFIGS["tiny"]


@pytest.mark.parametrize("change,field", [
    ({"hidden_size": None}, "hidden_size"),
    ({"num_attention_heads": 5}, "hidden_size"),            # 96 / 5
    ({"num_key_value_heads": 4}, "num_key_value_heads"),    # 6 % 4
    ({"intermediate_size": 0}, "intermediate_size"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
    ({"rms_norm_eps": -1}, "rms_norm_eps"),
    ({"vocab_size": "big"}, "vocab_size"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"type": "linear", "factor": 2}}, "rope_scaling"),
    ({"head_dim": 32}, "head_dim"),
])
def test_bad_fields_are_named(change, field):
    data = {**GOOD, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        from_hf_dict(data, "x")
    assert err.value.field == field


def test_the_run_spec_carries_the_whole_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GOOD))
    c = resolve_model(str(tmp_path / "config.json"))
    spec = RunSpec(run="r", model=c.name, num_stages=3, skip_ratio=0.0, model_config=to_spec_json(c))
    back = codec.decode(codec.encode(spec))
    assert spec_model(back.model, back.model_config) == c            # no file needed on the peer
    assert to_spec_json(CONFIGS["tiny"]) == ""                        # presets travel by name, as before
    assert spec_model("tiny", "") is CONFIGS["tiny"]
    with pytest.raises(ConfigError, match="unknown model"):
        spec_model("nope", "")


def test_cli_refuses_a_bad_config_at_once(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**GOOD, "num_key_value_heads": 4}))
    for cmd in (["coordinator.cli", "--model", str(bad)],
                ["launcher", "--model", str(bad), "--peers", "2", "--stages", "2"],
                ["coordinator.cli", "--model", "tiny", "--stages", "7"]):
        proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and ("num_key_value_heads" in lines[0] or "num_hidden_layers" in lines[0]), lines


def test_the_vocab_size_follows_the_tokenizer(tmp_path):
    assert resolve_model("tiny", tokenizer_vocab=4096).vocab_size == 4096
    assert resolve_model("tiny", tokenizer_vocab=257).vocab_size == 320
    assert to_spec_json(resolve_model("tiny", tokenizer_vocab=4096)) != ""     # travels in full
    no_vocab = {k: v for k, v in GOOD.items() if k != "vocab_size"}
    (tmp_path / "config.json").write_text(json.dumps(no_vocab))
    assert resolve_model(str(tmp_path), tokenizer_vocab=5000).vocab_size == 5056
    with pytest.raises(ConfigError) as err:
        from_hf_dict(GOOD, "x", tokenizer_vocab=4096)                          # 384 < 4096
    assert err.value.field == "vocab_size"
