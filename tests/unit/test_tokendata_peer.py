"""A peer's --data DIR: a dataset folder is verified and sampled as torch batches; a damaged
one, one whose tokens do not fit the model, or a missing path is refused in one line."""
from __future__ import annotations

import pytest
import torch

from peer.cli import main as peer_main
from peer.data import CorpusError, TextDataset, is_dataset_dir, load_token_data
from tokendata.build import build_dataset
from tokendata.tokenizer import load_tokenizer

BYTE_MODEL_VOCAB = 320


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("peerdata")
    text = "".join(f"line {i}: the peer trains on shards.\n" for i in range(300))
    (root / "in.txt").write_text(text)
    for spec in ("byte", "bpe"):
        build_dataset([root / "in.txt"], load_tokenizer(spec), root / spec, shard_tokens=3000, val_tokens=500)
    return root, text


def test_dataset_folder_gives_torch_batches_like_the_byte_corpus(folders):
    root, text = folders
    assert is_dataset_dir(root / "byte") and not is_dataset_dir(root / "in.txt") and not is_dataset_dir(None)
    train, val = load_token_data(root / "byte", BYTE_MODEL_VOCAB)
    kw = dict(seed=1, iteration=2, microbatch=3, samples=4, seq_len=32)
    x, y = train.shard(1, 2).batch(**kw)
    assert x.dtype == torch.int64 and x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, train.shard(1, 2).batch(**kw)[0])
    # byte tokens: every window is a piece of the text, and the same kind of batch TextDataset gives
    for row in x:
        assert bytes(row.tolist()).decode() in text
    ref_x, _ = TextDataset(text.encode()).shard(1, 2).batch(**kw)
    assert ref_x.shape == x.shape and ref_x.dtype == x.dtype
    assert len(list(val.eval_batches(samples=2, seq_len=31))) == 500 // 64


def test_tokens_that_do_not_fit_the_model_are_refused(folders):
    root, _ = folders
    with pytest.raises(CorpusError, match="4096 tokens\\), more than the model's vocabulary of 320"):
        load_token_data(root / "bpe", BYTE_MODEL_VOCAB)
    train, _ = load_token_data(root / "bpe", 4096)
    assert int(train.batch(seed=0, iteration=0, microbatch=0, samples=8, seq_len=16)[0].max()) < 4096


def test_damaged_dataset_refused_at_startup_and_on_the_command_line(folders, tmp_path, capsys):
    import shutil
    root, _ = folders
    bad = tmp_path / "bad"
    shutil.copytree(root / "byte", bad)
    shard = bad / "train_000001.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match="train_000001.bin: sha256 mismatch"):
        load_token_data(bad, BYTE_MODEL_VOCAB)
    shard.unlink()
    for path, message in ((bad, "train_000001.bin: shard missing"), (tmp_path / "nope", "nope: no such file")):
        with pytest.raises(SystemExit) as exc:
            peer_main(["--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJwh1JuJLHbe5ZVJA7UBHriuPrxuNEpzUQDexmddJiTXj", "--data", str(path)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and err.count("\n") == 1, err
