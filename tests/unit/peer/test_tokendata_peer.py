"""A peer's --data DIR: a dataset folder with a missing shard, or a missing path, is refused in
one line on the command line (peer/training_data.py verifies hashes and samples a folder once
the run spec is known: tests/unit/peer/test_training_data.py)."""
from __future__ import annotations

import shutil

import pytest

from peer.cli import main as peer_main
from tokendata.build import build_dataset
from tokendata.tokenizer import load_tokenizer

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("peerdata")
    text = "".join(f"line {i}: the peer trains on shards.\n" for i in range(300))
    (root / "in.txt").write_text(text)
    build_dataset([root / "in.txt"], load_tokenizer("byte"), root / "byte", shard_tokens=3000, val_tokens=500)
    return root


def test_a_missing_shard_or_folder_is_refused_on_the_command_line(folders, tmp_path, capsys):
    root = folders
    bad = tmp_path / "bad"
    shutil.copytree(root / "byte", bad)
    shard = bad / "train_000001.bin"
    shard.unlink()
    for path, message in ((bad, "train_000001.bin: shard missing"), (tmp_path / "nope", "nope: no such file")):
        with pytest.raises(SystemExit) as exc:
            peer_main(["--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJwh1JuJLHbe5ZVJA7UBHriuPrxuNEpzUQDexmddJiTXj", "--data", str(path)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and err.count("\n") == 1, err
