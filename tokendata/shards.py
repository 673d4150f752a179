"""TokenDataset: reproducible training batches from memory-mapped token shards.

The same sampling API as peer/data.py's TextDataset, so a stage-0 peer can use either: any
process rebuilds any batch from (seed, shard, iteration, microbatch). Arrays are numpy (this
package is torch-free); peer/ turns them into tensors.
"""
from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tokendata.manifest import DatasetError, DatasetManifest, verify_dataset


class TokenDataset:
    """Tokens [start, end) of the concatenation of `parts` (memmaps), seen as one stream."""

    def __init__(self, parts: list[np.ndarray], start: int = 0, end: int | None = None,
                 shard_index: int = 0, num_shards: int = 1):
        self.parts = parts
        self.offsets = [0]
        for p in parts:
            self.offsets.append(self.offsets[-1] + len(p))
        self.start, self.end = start, self.offsets[-1] if end is None else end
        self.shard_index, self.num_shards = shard_index, num_shards

    def __len__(self) -> int:
        return self.end - self.start

    def tokens(self, start: int, length: int) -> np.ndarray:
        """`length` tokens from position `start` of this region (across shard files)."""
        lo = self.start + start
        if start < 0 or lo + length > self.end:
            raise IndexError(f"tokens [{start}, {start + length}) outside a region of {len(self)}")
        out, k = [], bisect.bisect_right(self.offsets, lo) - 1
        while length > 0:
            local = lo - self.offsets[k]
            take = min(length, len(self.parts[k]) - local)
            out.append(self.parts[k][local:local + take])
            lo, length, k = lo + take, length - take, k + 1
        return out[0] if len(out) == 1 else np.concatenate(out)

    def shard(self, shard_index: int, num_shards: int) -> TokenDataset:
        """Disjoint contiguous region `shard_index` of `num_shards` (one per stage-0 peer)."""
        if num_shards < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(f"shard {shard_index} of {num_shards}")
        n = len(self)
        return TokenDataset(self.parts, self.start + n * shard_index // num_shards,
                            self.start + n * (shard_index + 1) // num_shards, shard_index, num_shards)

    def batch(self, *, seed: int, iteration: int, microbatch: int, samples: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, targets), int64 of shape (samples, seq_len); targets are shifted by one.
        Window starts come from a generator keyed by (seed, shard, iteration, microbatch)."""
        if samples < 1 or seq_len < 1:
            raise ValueError("samples and seq_len must be >= 1")
        span = len(self) - seq_len - 1
        if span < 0:
            raise DatasetError(f"shard {self.shard_index}/{self.num_shards} has {len(self)} tokens, "
                               f"fewer than seq_len + 1 = {seq_len + 1}")
        rng = np.random.default_rng(batch_seed(seed, self.shard_index, self.num_shards,
                                               iteration, microbatch))
        starts = rng.integers(0, span + 1, size=samples)
        windows = np.stack([self.tokens(int(s), seq_len + 1) for s in starts]).astype(np.int64)
        return windows[:, :-1].copy(), windows[:, 1:].copy()

    def eval_batches(self, *, samples: int, seq_len: int,
                     max_batches: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Non-overlapping windows from the start, in order (for held-out loss)."""
        step = seq_len + 1
        count = (len(self) // step) // samples
        if max_batches is not None:
            count = min(count, max_batches)
        for b in range(count):
            rows = self.tokens(b * samples * step, samples * step).astype(np.int64).reshape(samples, step)
            yield rows[:, :-1].copy(), rows[:, 1:].copy()


def batch_seed(*parts: int) -> int:
    """Same derivation as peer/data.py's, so a batch's identity does not depend on the source."""
    digest = hashlib.sha256(("skippipe-batch:" + ":".join(map(str, parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _memmap(directory: Path, file: str, dtype: str, tokens: int) -> np.ndarray:
    if tokens == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(directory / file, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(tokens,))


def open_dataset(directory: str | Path, shard_index: int = 0, num_shards: int = 1, *,
                 expected_dataset_id: str | None = None, expected_tokenizer_hash: str | None = None,
                 check_hashes: bool = True) -> tuple[TokenDataset, TokenDataset, DatasetManifest]:
    """(this peer's training region, the validation set, the manifest), after verify_dataset."""
    directory = Path(directory)
    m = verify_dataset(directory, expected_dataset_id, expected_tokenizer_hash, check_hashes)
    train = TokenDataset([_memmap(directory, s.file, m.dtype, s.tokens) for s in m.train])
    val = TokenDataset([_memmap(directory, m.validation.file, m.dtype, m.validation.tokens)]
                       if m.validation else [])
    return train.shard(shard_index, num_shards), val, m
