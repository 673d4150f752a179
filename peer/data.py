"""Byte-level tokenizer, the embedded default corpus, sharding and a reproducible sampler.

Any process can rebuild any batch from (seed, shard, iteration, microbatch): a re-issued
microbatch, or a test, sees exactly the same tokens as the original.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.resources
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

EOS_ID = 256
VOCAB_SIZE = 257                      # bytes 0..255 + EOS; model vocab is padded above this
DEFAULT_HELD_OUT = 0.05
_CORPUS_FILE = "shakespeare.txt.gz"


class CorpusError(ValueError):
    """The corpus is missing, empty or too small for the request."""


class ByteTokenizer:
    eos_id, vocab_size = EOS_ID, VOCAB_SIZE

    def encode(self, text: str | bytes, eos: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return list(data) + ([EOS_ID] if eos else [])

    def decode(self, ids) -> str:
        """Ids >= 256 (EOS, padding) are dropped; invalid UTF-8 is replaced, not raised."""
        ids = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else ids
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def load_corpus(path: str | Path | None = None) -> bytes:
    """None: the embedded Shakespeare corpus. A file: its bytes (.gz is decompressed).
    A folder: its *.txt files in name order (recursively), joined by blank lines."""
    if path is None:
        ref = importlib.resources.files("peer") / "corpus" / _CORPUS_FILE
        data = gzip.decompress(ref.read_bytes())
    else:
        p = Path(path)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*.txt") if f.is_file())
            if not files:
                raise CorpusError(f"no .txt files in folder {p}")
            data = b"\n\n".join(f.read_bytes() for f in files)
        elif p.is_file():
            raw = p.read_bytes()
            data = gzip.decompress(raw) if p.suffix == ".gz" else raw
        else:
            raise CorpusError(f"corpus path {p} does not exist")
    if not data.strip():
        raise CorpusError(f"corpus {path or 'embedded'} is empty")
    return data


class TextDataset:
    """A contiguous region of a byte corpus, as uint8 token ids."""

    def __init__(self, data: bytes | np.ndarray, shard_index: int = 0, num_shards: int = 1):
        self.tokens = (np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray))
                       else np.asarray(data, dtype=np.uint8))
        self.shard_index, self.num_shards = shard_index, num_shards

    def __len__(self) -> int:
        return len(self.tokens)

    def split(self, held_out_fraction: float = DEFAULT_HELD_OUT) -> tuple[TextDataset, TextDataset]:
        """(train, held_out): the held-out part is the last fraction of the corpus."""
        if not 0.0 <= held_out_fraction < 1.0:
            raise ValueError("held_out_fraction must be in [0, 1)")
        cut = len(self.tokens) - int(len(self.tokens) * held_out_fraction)
        return TextDataset(self.tokens[:cut]), TextDataset(self.tokens[cut:])

    def shard(self, shard_index: int, num_shards: int) -> TextDataset:
        """Disjoint contiguous region `shard_index` of `num_shards` (one per stage-0 peer)."""
        if num_shards < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(f"shard {shard_index} of {num_shards}")
        n = len(self.tokens)
        start, end = n * shard_index // num_shards, n * (shard_index + 1) // num_shards
        return TextDataset(self.tokens[start:end], shard_index, num_shards)

    def batch(self, *, seed: int, iteration: int, microbatch: int, samples: int,
              seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, targets), int64 of shape (samples, seq_len); targets are shifted by one.

        Window starts are drawn from a generator keyed by (seed, shard, iteration, microbatch).
        """
        if samples < 1 or seq_len < 1:
            raise ValueError("samples and seq_len must be >= 1")
        span = len(self.tokens) - seq_len - 1
        if span < 0:
            raise CorpusError(f"shard {self.shard_index}/{self.num_shards} has {len(self.tokens)} "
                              f"bytes, fewer than seq_len + 1 = {seq_len + 1}")
        rng = np.random.default_rng(_batch_seed(seed, self.shard_index, self.num_shards,
                                                iteration, microbatch))
        starts = rng.integers(0, span + 1, size=samples)
        windows = np.stack([self.tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
        t = torch.from_numpy(windows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def eval_batches(self, *, samples: int, seq_len: int,
                     max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Non-overlapping windows from the start, in order (for held-out loss)."""
        step = seq_len + 1
        count = (len(self.tokens) // step) // samples
        if max_batches is not None:
            count = min(count, max_batches)
        for b in range(count):
            base = b * samples * step
            rows = [self.tokens[base + i * step: base + (i + 1) * step] for i in range(samples)]
            t = torch.from_numpy(np.stack(rows).astype(np.int64))
            yield t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _batch_seed(*parts: int) -> int:
    digest = hashlib.sha256(("skippipe-batch:" + ":".join(map(str, parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little")
