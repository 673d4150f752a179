"""`skippipe-coordinator tokenizer` and `data`: they work end to end through the real parser,
and bad flags or bad inputs give one line on stderr and exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coordinator.cli import main
from tokendata.manifest import verify_dataset
from tokendata.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def test_tokenizer_then_data(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 300)
    (tmp_path / "in" / "b.jsonl").write_text(json.dumps({"text": "the lazy dog sleeps"}) + "\n")
    tok_path = tmp_path / "tok.json"
    assert main(["tokenizer", "--input", str(tmp_path / "in"), "--vocab-size", "300", "-o", str(tok_path)]) == 0
    tok = load_tokenizer(tok_path)
    assert 257 < tok.vocab_size <= 300 and str(tok_path) in capsys.readouterr().out
    assert main(["data", "--input", str(tmp_path / "in"), "--tokenizer", str(tok_path), "-o",
                 str(tmp_path / "ds"), "--shard-tokens", "500", "--val-fraction", "0.1"]) == 0
    out = capsys.readouterr()
    m = verify_dataset(tmp_path / "ds", expected_tokenizer_hash=tok.hash)
    assert m.dataset_id in out.out and "MB/s" in out.err and len(m.train) > 1
    tokens = np.concatenate([np.fromfile(tmp_path / "ds" / s.file, dtype="<u2") for s in m.train])
    assert tok.decode(tokens).startswith("the quick brown fox")


BAD = [
    (["data", "--input", "x.txt", "-o", "ds", "--val-fraction", "1.5"], "--val-fraction: must be in [0, 1)"),
    (["data", "--input", "x.txt", "-o", "ds", "--shard-tokens", "0"], "--shard-tokens: must be >= 1"),
    (["data", "--input", "x.txt", "-o", "ds", "--val-fraction", "0.1", "--val-tokens", "5"], "not allowed with"),
    (["data", "--input", "x.txt"], "required: -o/--output"),
    (["data", "--input", "x.txt", "-o", "ds", "--tokenizer", "nope.json"], "'nope.json' is not 'byte', 'bpe'"),
    (["data", "--input", "missing.txt", "-o", "ds"], "missing.txt: no such file or folder"),
    (["data", "--input", "empty.txt", "-o", "ds"], "empty.txt: empty file"),
    (["tokenizer", "--input", "x.txt", "--vocab-size", "100", "-o", "t.json"], "--vocab-size: must be in [257"),
    (["tokenizer", "--input", "x.txt", "--vocab-size", "300", "-o", "no/such/t.json"], "folder no/such does not exist"),
    (["tokenizer", "--input", "corrupt.jsonl", "--vocab-size", "300", "-o", "t.json"], "corrupt.jsonl: line 1 is not valid JSON"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m for _, m in BAD])
def test_bad_flags_and_inputs_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    Path("x.txt").write_text("some text\n")
    Path("empty.txt").write_text("")
    Path("corrupt.jsonl").write_text("{nope\n")
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not Path("ds").exists() and not Path("t.json").exists()


def test_console_script_help_lists_the_subcommands():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "coordinator.cli", "--help"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0 and "tokenizer" in out.stdout and "data " in out.stdout
