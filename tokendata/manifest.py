"""dataset.json: what a dataset folder holds, and the checks that it still holds it.

    {
      "format": "skippipe-dataset", "version": 1,
      "dataset_id": "3f1c9a0b2d4e5f60",          # sha256 over tokenizer hash, dtype, shard hashes
      "tokenizer": {"name": "bpe", "hash": "ae0d...", "vocab_size": 4096, "eos_id": 0},
      "dtype": "uint16",                          # flat little-endian arrays, nanoGPT style
      "train": [{"file": "train_000000.bin", "tokens": 100000000, "sha256": "..."}, ...],
      "validation": {"file": "validation.bin", "tokens": 500000, "sha256": "..."},
      "train_tokens": 123456789, "validation_tokens": 500000,
      "documents": 1234, "source_bytes": 987654321
    }
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

FORMAT, VERSION = "skippipe-dataset", 1
MANIFEST = "dataset.json"
DTYPES = ("uint16", "uint32")
_HASH_BLOCK = 1 << 22


class DatasetError(ValueError):
    """A dataset folder is missing, corrupt or not the one expected (one line, names the file)."""


@dataclass(frozen=True)
class ShardInfo:
    file: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    hash: str
    vocab_size: int
    eos_id: int


@dataclass(frozen=True)
class DatasetManifest:
    tokenizer: TokenizerInfo
    dtype: str
    train: tuple[ShardInfo, ...]
    validation: ShardInfo | None
    documents: int = 0
    source_bytes: int = 0
    version: int = VERSION
    dataset_id: str = field(default="")

    def __post_init__(self):
        if not self.dataset_id:
            object.__setattr__(self, "dataset_id", compute_dataset_id(self))

    @property
    def train_tokens(self) -> int:
        return sum(s.tokens for s in self.train)

    @property
    def validation_tokens(self) -> int:
        return self.validation.tokens if self.validation else 0

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        return self.train + ((self.validation,) if self.validation else ())

    def to_json(self) -> str:
        d = {"format": FORMAT, "version": self.version, "dataset_id": self.dataset_id,
             "tokenizer": asdict(self.tokenizer), "dtype": self.dtype,
             "train": [asdict(s) for s in self.train],
             "validation": asdict(self.validation) if self.validation else None,
             "train_tokens": self.train_tokens, "validation_tokens": self.validation_tokens,
             "documents": self.documents, "source_bytes": self.source_bytes}
        return json.dumps(d, indent=2) + "\n"


def compute_dataset_id(m: DatasetManifest) -> str:
    """Contents only (not names or counts of input bytes): same tokens, same id."""
    h = hashlib.sha256(f"{FORMAT}:{m.version}:{m.tokenizer.hash}:{m.dtype}".encode())
    for s in m.train:
        h.update(f":train:{s.tokens}:{s.sha256}".encode())
    if m.validation:
        h.update(f":validation:{m.validation.tokens}:{m.validation.sha256}".encode())
    return h.hexdigest()[:16]


def _shard(d, where: str) -> ShardInfo:
    if not isinstance(d, dict):
        raise DatasetError(f"{where} is not an object")
    try:
        s = ShardInfo(str(d["file"]), int(d["tokens"]), str(d["sha256"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{where} lacks a valid {exc.args[0] if isinstance(exc, KeyError) else 'field'}") from None
    if "/" in s.file or "\\" in s.file or s.file.startswith(".") or s.tokens < 0:
        raise DatasetError(f"{where}: bad file name or token count ({s.file!r}, {s.tokens})")
    return s


def manifest_from_json(text: str, where: str = MANIFEST) -> DatasetManifest:
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DatasetError(f"{where}: not a {FORMAT} manifest")
    if d.get("version") != VERSION:
        raise DatasetError(f"{where}: unsupported version {d.get('version')!r} (this build reads {VERSION})")
    if d.get("dtype") not in DTYPES:
        raise DatasetError(f"{where}: dtype {d.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    try:
        t = d["tokenizer"]
        tok = TokenizerInfo(str(t["name"]), str(t["hash"]), int(t["vocab_size"]), int(t["eos_id"]))
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{where}: 'tokenizer' needs name, hash, vocab_size and eos_id") from None
    if not isinstance(d.get("train"), list) or not d["train"]:
        raise DatasetError(f"{where}: 'train' must be a non-empty list of shards")
    train = tuple(_shard(s, f"{where}: train[{i}]") for i, s in enumerate(d["train"]))
    val = _shard(d["validation"], f"{where}: validation") if d.get("validation") else None
    m = DatasetManifest(tok, d["dtype"], train, val, int(d.get("documents", 0)),
                        int(d.get("source_bytes", 0)))
    if d.get("dataset_id") != m.dataset_id:
        raise DatasetError(f"{where}: dataset_id {d.get('dataset_id')!r} does not match its contents "
                           f"({m.dataset_id}); the manifest was edited")
    if len({s.file for s in m.shards}) != len(m.shards):
        raise DatasetError(f"{where}: a shard file is listed twice")
    return m


def read_manifest(directory: str | Path) -> DatasetManifest:
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise DatasetError(f"{directory}: no such dataset folder")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing (not a dataset folder; build one with "
                           f"`skippipe-coordinator data`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return manifest_from_json(text, str(path))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def verify_dataset(directory: str | Path, expected_dataset_id: str | None = None,
                   expected_tokenizer_hash: str | None = None,
                   check_hashes: bool = True) -> DatasetManifest:
    """The manifest, once every shard is present with the right size (and sha256), and the
    dataset and tokenizer are the ones expected; DatasetError naming the culprit otherwise."""
    directory = Path(directory)
    m = read_manifest(directory)
    if expected_dataset_id is not None and m.dataset_id != expected_dataset_id:
        raise DatasetError(f"{directory / MANIFEST}: dataset {m.dataset_id}, but the run expects "
                           f"{expected_dataset_id}")
    if expected_tokenizer_hash is not None and m.tokenizer.hash != expected_tokenizer_hash:
        raise DatasetError(f"{directory / MANIFEST}: tokenized with {m.tokenizer.name} "
                           f"({m.tokenizer.hash[:12]}), but the run's tokenizer is "
                           f"{expected_tokenizer_hash[:12]}")
    itemsize = np.dtype(m.dtype).itemsize
    for s in m.shards:
        path = directory / s.file
        if not path.is_file():
            raise DatasetError(f"{path}: shard missing")
        size = path.stat().st_size
        if size != s.tokens * itemsize:
            raise DatasetError(f"{path}: {size} bytes, the manifest says {s.tokens} {m.dtype} "
                               f"tokens = {s.tokens * itemsize} bytes (truncated or replaced)")
        if check_hashes and file_sha256(path) != s.sha256:
            raise DatasetError(f"{path}: sha256 mismatch (corrupt shard)")
    return m
