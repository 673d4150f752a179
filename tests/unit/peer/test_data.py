"""peer.data: tokenizer, embedded corpus, shards, reproducible batches."""
import gzip

import numpy as np
import pytest
import torch

from peer.data import EOS_ID, ByteTokenizer, CorpusError, TextDataset, load_corpus
from peer.compute.model import get_config


def test_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "To be, or not to be — ça va? 東京"
    ids = tok.encode(text, eos=True)
    assert ids[-1] == EOS_ID and max(ids[:-1]) < 256
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.vocab_size <= get_config("tiny").vocab_size


def test_embedded_corpus():
    data = load_corpus()
    assert len(data) > 1_000_000
    assert b"HAMLET" in data and b"Gutenberg" not in data[:2000]


def test_corpus_from_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"second")
    (tmp_path / "a.txt").write_bytes(b"first")
    assert load_corpus(tmp_path) == b"first\n\nsecond"
    assert load_corpus(tmp_path / "a.txt") == b"first"
    gz = tmp_path / "c.gz"
    gz.write_bytes(gzip.compress(b"zipped"))
    assert load_corpus(gz) == b"zipped"
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no .txt"):
        load_corpus(tmp_path / "empty")
    (tmp_path / "blank.txt").write_bytes(b"  \n")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(tmp_path / "blank.txt")


def test_split_and_disjoint_shards():
    ds = TextDataset(bytes(range(256)) * 40)
    train, held = ds.split(0.05)
    assert len(train) + len(held) == len(ds) and len(held) == int(len(ds) * 0.05)
    shards = [train.shard(i, 3) for i in range(3)]
    assert np.array_equal(np.concatenate([s.tokens for s in shards]), train.tokens)
    with pytest.raises(ValueError):
        train.shard(3, 3)


def test_batches_stay_inside_their_shard():
    ds = TextDataset(b"a" * 1000 + b"b" * 1000 + b"c" * 1000)
    for i, letter in enumerate(b"abc"):
        tokens, targets = ds.shard(i, 3).batch(seed=0, iteration=2, microbatch=1, samples=8,
                                               seq_len=32)
        assert (tokens == letter).all() and (targets == letter).all()


def _train(shard_index: int, num_shards: int) -> TextDataset:
    return TextDataset(load_corpus()).split()[0].shard(shard_index, num_shards)


def test_batches_deterministic_and_shifted():
    train = _train(1, 2)
    kw = dict(seed=3, iteration=5, microbatch=2, samples=4, seq_len=64)
    tokens, targets = train.batch(**kw)
    assert tokens.shape == targets.shape == (4, 64) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    again = _train(1, 2).batch(**kw)
    assert torch.equal(again[0], tokens) and torch.equal(again[1], targets)
    assert not torch.equal(train.batch(**{**kw, "microbatch": 3})[0], tokens)
    assert not torch.equal(train.batch(**{**kw, "iteration": 6})[0], tokens)
    other = _train(0, 2)
    assert not torch.equal(other.batch(**kw)[0], tokens)
    with pytest.raises(CorpusError):
        TextDataset(b"short").batch(seed=0, iteration=0, microbatch=0, samples=1, seq_len=8)


def test_eval_batches():
    _, held = TextDataset(load_corpus()).split()
    batches = list(held.eval_batches(samples=2, seq_len=16, max_batches=3))
    assert len(batches) == 3 and batches[0][0].shape == (2, 16)
    assert not torch.equal(batches[0][0], batches[1][0])
