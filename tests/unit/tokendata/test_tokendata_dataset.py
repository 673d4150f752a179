"""Dataset folders: inputs of every kind -> the expected token stream, manifest hashes checked,
bad inputs and damaged folders refused with one-line errors naming the file, memmap batches."""
from __future__ import annotations

import gzip
import re
import json

import numpy as np
import pytest

from tokendata import build, readers
from tokendata.build import build_dataset
from tokendata.manifest import DatasetError, read_manifest, verify_dataset
from tokendata.readers import InputError
from tokendata.shards import TokenDataset, open_dataset
from tokendata.tokenizer import load_tokenizer

DOCS = {"a.txt": "First file.\nÜnïcödé line 日本\n", "b.jsonl": ["json doc one", "json doc two\n"],
        "c.jsonl.gz": ["gz doc ✓"], "d.parquet": ["parquet row one", "parquet row two"]}


def write_inputs(folder):
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_text(DOCS["a.txt"])
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS["b.jsonl"]) + "\n")
    (folder / "c.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": DOCS["c.jsonl.gz"][0], "id": 7}).encode()))
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": DOCS["d.parquet"], "n": [1, 2]}), folder / "d.parquet")
    (folder / "notes.md").write_text("ignored: not an input type")
    return folder


def expected_stream(tok) -> list[int]:
    docs = [DOCS["a.txt"], *DOCS["b.jsonl"], *DOCS["c.jsonl.gz"], *DOCS["d.parquet"]]   # name order
    return [i for d in docs for i in tok.encode(d, eos=True)]


@pytest.mark.parametrize("spec", ["byte", "bpe"])
def test_all_input_kinds_give_the_expected_tokens(tmp_path, spec):
    tok = load_tokenizer(spec)
    m = build_dataset([write_inputs(tmp_path / "in")], tok, tmp_path / "ds", val_fraction=0.0)
    stream = expected_stream(tok)
    assert m.documents == 6 and m.validation is None and m.dtype == "uint16"
    got = np.fromfile(tmp_path / "ds" / m.train[0].file, dtype="<u2")
    assert got.tolist() == stream and m.train_tokens == len(stream)
    assert tok.decode(got) == "".join([DOCS["a.txt"], *DOCS["b.jsonl"], *DOCS["c.jsonl.gz"], *DOCS["d.parquet"]])
    assert read_manifest(tmp_path / "ds").dataset_id == m.dataset_id
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["dataset.json", "train_000000.bin"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds")]     # temp folder gone


def test_shards_split_and_validation_tail_and_blocks(tmp_path, monkeypatch):
    tok = load_tokenizer("byte")
    write_inputs(tmp_path / "in")
    stream = expected_stream(tok)
    # small dataset (below one validation block): the last ceil(f * n) tokens are validation
    m = build_dataset([tmp_path / "in"], tok, tmp_path / "tail", shard_tokens=50, val_fraction=0.1)
    k = -(-len(stream) // 10)
    train = np.concatenate([np.fromfile(tmp_path / "tail" / s.file, dtype="<u2") for s in m.train])
    assert [s.tokens for s in m.train][:-1] == [50] * (len(m.train) - 1)
    assert train.tolist() == stream[:-k] and m.validation_tokens == k
    assert np.fromfile(tmp_path / "tail" / "validation.bin", dtype="<u2").tolist() == stream[-k:]
    # larger: every 1/f-th block of `val_block` tokens, spread over the stream
    m = build_dataset([tmp_path / "in"], tok, tmp_path / "blocks", shard_tokens=10**6,
                      val_fraction=0.25, val_block=8)
    val = np.fromfile(tmp_path / "blocks" / "validation.bin", dtype="<u2").tolist()
    blocks = [stream[i:i + 8] for i in range(0, len(stream), 8)]
    assert val == [t for i, b in enumerate(blocks) if i % 4 == 3 for t in b]
    # --val-tokens N: the first N tokens
    m = build_dataset([tmp_path / "in"], tok, tmp_path / "first", val_tokens=30)
    assert np.fromfile(tmp_path / "first" / "validation.bin", dtype="<u2").tolist() == stream[:30]
    assert m.train_tokens == len(stream) - 30
    # the dataset id follows the contents, not the folder
    again = build_dataset([tmp_path / "in"], tok, tmp_path / "first2", val_tokens=30)
    assert again.dataset_id == m.dataset_id
    assert build_dataset([tmp_path / "in"], tok, tmp_path / "other", val_tokens=31).dataset_id != m.dataset_id


def test_streaming_memory_stays_bounded(tmp_path, monkeypatch):
    """A 'large' file is read in pieces and written batch by batch: shrink both and check that
    no encode call ever sees more than a batch."""
    monkeypatch.setattr(readers, "PIECE_BYTES", 64)
    monkeypatch.setattr(build, "BATCH_BYTES", 256)
    tok = load_tokenizer("bpe")
    text = "".join(f"line {i} of a long file\n" for i in range(2000))
    (tmp_path / "big.txt").write_text(text)
    seen = []
    real = build.FlatEncoder.encode
    monkeypatch.setattr(build.FlatEncoder, "encode",
                        lambda self, texts, ends: seen.append(sum(map(len, texts))) or real(self, texts, ends))
    progress = []
    m = build_dataset([tmp_path / "big.txt"], tok, tmp_path / "ds", val_fraction=0.0, workers=1,
                      progress=progress.append)
    assert len(seen) > 50 and max(seen) < 400
    assert progress == sorted(progress) and progress[-1] == len(text.encode())
    got = np.fromfile(tmp_path / "ds" / m.train[0].file, dtype="<u2")
    assert tok.decode(got) == text and got[-1] == tok.eos_id and (got == tok.eos_id).sum() == 1


@pytest.mark.parametrize("name,content,message", [
    ("empty.txt", b"", "empty.txt: empty file"),
    ("blank.txt", b"  \n\n", "blank.txt: empty (no text)"),
    ("bad.txt", b"ok\n\xff\xfe bad bytes\n", "bad.txt: not valid UTF-8"),
    ("bad.jsonl", b'{"text": "fine"}\n{not json\n', "bad.jsonl: line 2 is not valid JSON"),
    ("notext.jsonl", b'{"body": "x"}\n', "notext.jsonl: line 1 has no string 'text' field"),
    ("bad.jsonl.gz", b"\x1f\x8b\x08\x00garbage", "bad.jsonl.gz: cannot read"),
    ("bad.parquet", b"PAR1 not really parquet", "bad.parquet: corrupt .parquet file"),
    ("nothing.csv", b"a,b", "nothing.csv: unsupported input type"),
])
def test_bad_inputs_are_refused_naming_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=re.escape(message)) as info:
        build_dataset([tmp_path / name], load_tokenizer("byte"), tmp_path / "ds")
    assert "\n" not in str(info.value) and not (tmp_path / "ds").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds")]


def test_parquet_without_text_column_and_missing_paths(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="x.parquet: no 'text' column"):
        build_dataset([tmp_path / "x.parquet"], load_tokenizer("byte"), tmp_path / "ds")
    with pytest.raises(InputError, match="missing: no such file"):
        build_dataset([tmp_path / "missing"], load_tokenizer("byte"), tmp_path / "ds")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep").write_text("x")
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(DatasetError, match="ds: already exists"):
        build_dataset([tmp_path / "a.txt"], load_tokenizer("byte"), tmp_path / "ds")


@pytest.fixture
def dataset(tmp_path):
    text = "".join(f"sample line number {i}, with words.\n" for i in range(400))
    (tmp_path / "in.txt").write_text(text)
    tok = load_tokenizer("bpe")
    m = build_dataset([tmp_path / "in.txt"], tok, tmp_path / "ds", shard_tokens=700, val_tokens=300)
    return tmp_path / "ds", m, tok


def test_verify_refuses_damage_naming_the_file(dataset):
    folder, m, tok = dataset
    assert verify_dataset(folder, m.dataset_id, tok.hash).dataset_id == m.dataset_id
    with pytest.raises(DatasetError, match=f"dataset {m.dataset_id}, but the run expects 0000"):
        verify_dataset(folder, expected_dataset_id="0000")
    with pytest.raises(DatasetError, match="tokenized with bpe .* but the run's tokenizer is"):
        verify_dataset(folder, expected_tokenizer_hash=load_tokenizer("byte").hash)
    shard = folder / m.train[1].file
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=f"{m.train[1].file}: sha256 mismatch"):
        verify_dataset(folder)
    verify_dataset(folder, check_hashes=False)          # sizes still right
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(DatasetError, match=f"{m.train[1].file}: 1398 bytes, .*truncated"):
        verify_dataset(folder, check_hashes=False)
    shard.unlink()
    with pytest.raises(DatasetError, match=f"{m.train[1].file}: shard missing"):
        verify_dataset(folder)


def test_manifest_edits_and_garbage_are_refused(dataset):
    folder, m, _ = dataset
    path = folder / "dataset.json"
    d = json.loads(path.read_text())
    d["train"][0]["tokens"] += 1
    path.write_text(json.dumps(d))
    with pytest.raises(DatasetError, match="dataset_id .* does not match its contents"):
        read_manifest(folder)
    d["train"][0]["file"] = "../escape.bin"
    path.write_text(json.dumps(d))
    with pytest.raises(DatasetError, match="bad file name"):
        read_manifest(folder)
    path.write_text("{broken")
    with pytest.raises(DatasetError, match="dataset.json: not valid JSON"):
        read_manifest(folder)
    path.unlink()
    with pytest.raises(DatasetError, match="dataset.json: missing"):
        read_manifest(folder)


def test_memmap_batches_reproducible_and_in_bounds(dataset):
    folder, m, tok = dataset
    train, val, _ = open_dataset(folder, expected_dataset_id=m.dataset_id)
    assert len(train) == m.train_tokens and len(m.train) > 2 and len(val) == 300
    stream = np.concatenate([np.fromfile(folder / s.file, dtype="<u2") for s in m.train]).astype(np.int64)
    kw = dict(seed=3, iteration=5, microbatch=1, samples=16, seq_len=40)
    x, y = train.batch(**kw)
    assert x.dtype == np.int64 and x.shape == (16, 40) and (x[:, 1:] == y[:, :-1]).all()
    x2, _ = open_dataset(folder)[0].batch(**kw)                 # another process, same batch
    assert (x == x2).all()
    assert not (x == train.batch(**{**kw, "microbatch": 2})[0]).all()
    for row, target in zip(x, y):                               # windows are real, across files too
        starts = [s for s in range(len(stream) - 40) if (stream[s:s + 40] == row).all()]
        assert starts and (stream[starts[0] + 1:starts[0] + 41] == target).all()
    assert x.max() < tok.vocab_size
    halves = [train.shard(i, 2) for i in range(2)]
    assert len(halves[0]) + len(halves[1]) == len(train)
    assert (halves[1].tokens(0, 5) == stream[len(halves[0]):len(halves[0]) + 5]).all()
    xs, _ = halves[1].batch(**kw)
    assert not (xs == x).all()
    evals = list(val.eval_batches(samples=2, seq_len=49))
    assert len(evals) == 3 and all(a.shape == (2, 49) for a, _ in evals)
    assert (evals[0][0][0] == np.fromfile(folder / "validation.bin", dtype="<u2")[:49]).all()
    with pytest.raises(DatasetError, match="fewer than seq_len"):
        TokenDataset([np.arange(10, dtype=np.uint16)]).batch(**{**kw, "seq_len": 10})


def test_txt_pieces_bound_memory_even_without_newlines(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "PIECE_BYTES", 16)
    text = "ab" * 50 + " " + "日本語" * 40 + "\n" + "x" * 20 + "ü" * 30
    (tmp_path / "long.txt").write_text(text)
    pieces = list(readers.iter_pieces(tmp_path / "long.txt"))
    assert "".join(p.text for p in pieces) == text and [p.doc_end for p in pieces].count(True) == 1
    assert max(p.nbytes for p in pieces) < 5 * 16 and sum(p.nbytes for p in pieces) == len(text.encode())
    (tmp_path / "bad.txt").write_bytes(b"x" * 100 + b"\n" + b"y" * 40 + b"\xff")
    with pytest.raises(InputError, match=re.escape("bad.txt: not valid UTF-8 (invalid start byte at byte 141)")):
        list(readers.iter_pieces(tmp_path / "bad.txt"))


def test_vocabularies_over_65536_tokens_are_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from tokendata.tokenizer import EOS_TOKEN, Tokenizer, bytes_to_unicode
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab.update({f"<unused{i}>": 256 + i for i in range(70_000)})     # never produced by text
    inner = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens([EOS_TOKEN])
    big = Tokenizer(inner, "big")
    assert big.vocab_size == 70_257 and big.eos_id == 70_256 and big.token_dtype == np.uint32
    (tmp_path / "a.txt").write_text("wide ids ✓\n" * 50)
    m = build_dataset([tmp_path / "a.txt"], big, tmp_path / "ds", val_tokens=11)
    assert m.dtype == "uint32" and (tmp_path / "ds" / m.train[0].file).stat().st_size == 4 * m.train_tokens
    train, val, _ = open_dataset(tmp_path / "ds")
    assert train.tokens(len(train) - 1, 1).tolist() == [70_256]
    x, _ = train.batch(seed=0, iteration=0, microbatch=0, samples=2, seq_len=8)
    assert big.decode(x[0]) in "wide ids ✓\n" * 50
