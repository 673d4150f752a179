"""The build's shortcuts give exactly tokenizers' ids, and the worker pool exactly the
single-process dataset."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokendata.build import build_dataset
from tokendata.fastpath import SELF_CHECK, FlatEncoder
from tokendata.manifest import verify_dataset
from tokendata.tokenizer import load_tokenizer

BPE = load_tokenizer("bpe")
BYTE = load_tokenizer("byte")
ENCODERS = {"bpe": FlatEncoder(BPE), "byte": FlatEncoder(BYTE)}

# letters, marks, digits, punctuation, every kind of space and control, CJK, emoji
TEXT = st.text(alphabet=st.one_of(
    st.sampled_from(list("abcXYZ'sltvdm \t\n\r\x0b\x0c\x1c\x1f\x85\u00a0\u2028\u3000\u200b.,!?-_0123")),
    st.characters(codec="utf-8")), max_size=60)


def test_shortcuts_are_in_use():
    assert ENCODERS["bpe"].mode == "words" and ENCODERS["byte"].mode == "byte"
    assert ENCODERS["bpe"].encode([SELF_CHECK], [True]).tolist() == BPE.encode(SELF_CHECK, eos=True)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=4), ends=st.lists(st.booleans(), min_size=4, max_size=4))
def test_shortcuts_equal_tokenizers(texts, ends):
    ends = ends[:len(texts)]
    for name, tok in (("bpe", BPE), ("byte", BYTE)):
        expected = [i for text, end in zip(texts, ends) for i in tok.encode(text, eos=end)]
        assert ENCODERS[name].encode(texts, ends).tolist() == expected, name


def test_other_tokenizers_go_through_tokenizers(tmp_path):
    import json
    d = json.loads(BPE.to_json_str())
    d["normalizer"] = {"type": "Lowercase"}
    path = tmp_path / "lower.json"
    path.write_text(json.dumps(d))
    tok = load_tokenizer(path)
    enc = FlatEncoder(tok)
    assert enc.mode == "tokenizers"
    assert enc.encode(["Hello World", "X"], [True, False]).tolist() == tok.encode("hello world", eos=True) + tok.encode("x")


@pytest.mark.parametrize("spec", ["bpe"])
def test_worker_pool_builds_the_same_dataset(tmp_path, spec, monkeypatch):
    from tokendata import build, readers
    monkeypatch.setattr(readers, "PIECE_BYTES", 2048)
    monkeypatch.setattr(build, "BATCH_BYTES", 8192)
    (tmp_path / "in").mkdir()
    for k in range(3):
        (tmp_path / "in" / f"{k}.txt").write_text("".join(f"doc {k} line {i}: naïve café 日本\n" for i in range(800)))
    tok = load_tokenizer(spec)
    one = build_dataset([tmp_path / "in"], tok, tmp_path / "one", workers=1, shard_tokens=5000)
    two = build_dataset([tmp_path / "in"], tok, tmp_path / "two", workers=2, shard_tokens=5000)
    assert one.dataset_id == two.dataset_id and len(one.train) > 2
    verify_dataset(tmp_path / "two", expected_dataset_id=one.dataset_id)
    text = "".join((tmp_path / "in" / f"{k}.txt").read_text() for k in range(3))
    ids = np.concatenate([np.fromfile(tmp_path / "two" / s.file, dtype="<u2") for s in two.shards])
    assert len(ids) == one.train_tokens + one.validation_tokens and (ids == tok.eos_id).sum() == 3
    assert sorted(tok.decode(ids)) == sorted(text)        # validation blocks are cut out, not lost
