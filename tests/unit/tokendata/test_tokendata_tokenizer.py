"""The byte and BPE tokenizers: exact byte ids, round trips, identity hashes, tokenizer.json
that transformers loads with the same ids, training from streamed inputs, one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tokendata.tokenizer import (EOS_TOKEN, TokenizerError, load_tokenizer, padded_vocab_size,
                                 train_bpe)

TEXTS = ["hello world", "  two  spaces\n\n\ttab\r\n", "héllo ünïcode 日本語 🎉 emoji",
         "literal <|endoftext|> in text", "\x00\x01\x7f control", "", "a" * 1000,
         "To be, or not to be: that is the question."]


def test_byte_tokenizer_gives_exactly_the_byte_ids():
    from peer.data import ByteTokenizer
    tok, ref = load_tokenizer("byte"), ByteTokenizer()
    assert (tok.vocab_size, tok.eos_id, tok.token_dtype) == (257, 256, np.uint16)
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text) == list(text.encode("utf-8"))
        assert tok.encode(text, eos=True) == ref.encode(text, eos=True)
        assert tok.decode(tok.encode(text, eos=True)) == text
    assert tok.encode_batch(TEXTS) == [ref.encode(t) for t in TEXTS]
    # padding rows (>= vocab) and EOS are dropped, invalid UTF-8 replaced, as ByteTokenizer does
    assert tok.decode([104, 105, 256, 300, 0xE6]) == ref.decode([104, 105, 256, 300, 0xE6])


def test_shipped_bpe_round_trips_and_compresses():
    tok = load_tokenizer("bpe")
    assert tok.name == "bpe" and 1000 < tok.vocab_size <= 65536 and tok.token_dtype == np.uint16
    assert tok.encode("", eos=True) == [tok.eos_id]
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
        assert tok.eos_id not in tok.encode(text)        # only documents' ends get EOS
    shakespeare = "To be, or not to be: that is the question: Whether 'tis nobler in the mind"
    assert len(tok.encode(shakespeare)) < len(shakespeare.encode()) / 2.5


def test_hash_is_the_tokenizer_identity(tmp_path):
    byte, bpe = load_tokenizer("byte"), load_tokenizer("bpe")
    assert byte.hash != bpe.hash and len(bpe.hash) == 64
    assert load_tokenizer("byte").hash == byte.hash
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(json.loads(bpe.to_json_str()), indent=4))  # reformatted, same tokenizer
    loaded = load_tokenizer(path)
    assert loaded.name == str(path) and loaded.hash == bpe.hash


@pytest.mark.parametrize("spec", ["byte", "bpe"])
def test_tokenizer_json_loads_in_transformers_with_the_same_ids(tmp_path, spec):
    from transformers import PreTrainedTokenizerFast
    tok = load_tokenizer(spec)
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_json_str())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOS_TOKEN)
    assert hf.eos_token_id == tok.eos_id and len(hf) == tok.vocab_size
    for text in TEXTS:
        if EOS_TOKEN in text:
            continue   # transformers maps a literal special token to EOS unless split_special_tokens
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
        assert hf.decode(tok.encode(text)) == text


def test_train_bpe_streams_inputs_and_reports_progress(tmp_path):
    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 200)
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": "the dog ate the log"}) for _ in range(100)))
    seen = []
    tok = train_bpe([tmp_path], 300, progress=seen.append)
    assert 257 < tok.vocab_size <= 300 and tok.decode(tok.encode("the cat sat")) == "the cat sat"
    assert len(tok.encode("the cat sat on the mat")) < 10
    assert seen and seen[-1] == (tmp_path / "a.txt").stat().st_size + (tmp_path / "b.jsonl").stat().st_size
    again = train_bpe([tmp_path], 300)
    assert again.hash == tok.hash     # deterministic


def test_errors_are_one_line(tmp_path):
    with pytest.raises(TokenizerError, match="not 'byte', 'bpe' or an existing"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="bad.json: not a valid tokenizer.json") as info:
        load_tokenizer(bad)
    assert "\n" not in str(info.value)
    bad.write_text('{"model": {"type": "Nope"}}')
    with pytest.raises(TokenizerError, match="bad.json"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="below 257"):
        train_bpe([bad], 100)


def test_padded_vocab_size():
    assert padded_vocab_size(257) == 320 and padded_vocab_size(4096) == 4096
    assert padded_vocab_size(4097) == 4160 and padded_vocab_size(1, 8) == 8
    with pytest.raises(ValueError):
        padded_vocab_size(0)


@pytest.mark.parametrize("spec", ["byte", "bpe"])
def test_autotokenizer_loads_the_saved_folder_with_the_same_ids(tmp_path, spec):
    from transformers import AutoTokenizer
    tok = load_tokenizer(spec)
    (tmp_path / "hf").mkdir()
    tok.save(tmp_path / "hf" / "tokenizer.json")
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(tok.hf_config(model_max_length=256)))
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert hf.eos_token_id == tok.eos_id and hf.model_max_length == 256
    for text in TEXTS:                 # including literal "<|endoftext|>": text, not EOS
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
        assert hf.decode(tok.encode(text)) == text
