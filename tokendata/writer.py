"""Token shards written incrementally, hashed as they are written (no second read)."""
from __future__ import annotations

import hashlib
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from tokendata.manifest import ShardInfo


class ShardWriter:
    """Flat little-endian token arrays, `shard_tokens` per file: name_000000.bin, ..."""

    def __init__(self, directory: Path, prefix: str, dtype: np.dtype, shard_tokens: int | None):
        self.directory, self.prefix, self.dtype = directory, prefix, np.dtype(dtype).newbyteorder("<")
        self.shard_tokens = shard_tokens
        self.shards: list[ShardInfo] = []
        self._file = None
        self._hash = None
        self._count = 0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards) + self._count

    def write(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self._file is None:
                self._open()
            room = len(ids) if self.shard_tokens is None else self.shard_tokens - self._count
            part, ids = ids[:room], ids[room:]
            data = part.tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._count += len(part)
            if self.shard_tokens is not None and self._count >= self.shard_tokens:
                self._close()

    def finish(self) -> list[ShardInfo]:
        if self._file is not None:
            self._close()
        return self.shards

    def _open(self) -> None:
        name = (f"{self.prefix}.bin" if self.shard_tokens is None
                else f"{self.prefix}_{len(self.shards):06d}.bin")
        self._file = open(self.directory / name, "wb")
        self._hash, self._count = hashlib.sha256(), 0

    def _close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())      # on disk before the folder is renamed into place
        self._file.close()
        self.shards.append(ShardInfo(Path(self._file.name).name, self._count, self._hash.hexdigest()))
        self._file = None


class Splitter:
    """Routes the token stream into train and validation, deterministically by stream position.

    val_tokens=N: the first N tokens are validation. val_fraction=f: the stream is cut into
    blocks of `block` tokens and block i is validation when floor((i+1)f) > floor(i f) (one in
    every 1/f, spread over the whole input, so validation is representative of all of it).
    A dataset too small to reach its first validation block gets its last ceil(f * total)
    tokens as validation instead: train holds back one block for that, never more.
    """

    def __init__(self, train: ShardWriter, val: ShardWriter, val_fraction: float = 0.0,
                 val_tokens: int | None = None, block: int = 1 << 14):
        self.train, self.val, self.val_tokens = train, val, val_tokens
        # exact rational arithmetic: 0.005 must select block 199, not miss it by a rounding error
        self.fraction = Fraction(val_fraction).limit_denominator(10 ** 6)
        self.block, self.position = block, 0
        self._held: list[np.ndarray] = []
        self._held_count = 0

    def _is_val_block(self, i: int) -> bool:
        return math.floor((i + 1) * self.fraction) > math.floor(i * self.fraction)

    def add(self, ids: np.ndarray) -> None:
        while len(ids):
            if self.val_tokens is not None:
                to_val = self.position < self.val_tokens
                n = (self.val_tokens - self.position) if to_val else len(ids)
            else:
                i = self.position // self.block
                to_val = self._is_val_block(i)
                n = (i + 1) * self.block - self.position
            part, ids = ids[:n], ids[n:]
            self.position += len(part)
            if to_val:
                self.val.write(part)
            else:
                self._hold(part)

    def _hold(self, part: np.ndarray) -> None:
        self._held.append(part)
        self._held_count += len(part)
        if self.val_tokens is not None or self.fraction == 0:
            self._release(self._held_count)
        elif self._held_count > self.block:
            self._release(self._held_count - self.block)

    def _release(self, n: int) -> None:
        merged = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
        self.train.write(merged[:n])
        rest = merged[n:]
        self._held, self._held_count = ([rest] if len(rest) else []), len(rest)

    def finish(self) -> None:
        if self._held_count and self.val.tokens == 0 and self.fraction > 0:
            k = min(self._held_count, max(1, math.ceil(self.position * self.fraction)))
            merged = np.concatenate(self._held)
            self.train.write(merged[:len(merged) - k])
            self.val.write(merged[len(merged) - k:])
            self._held, self._held_count = [], 0
        elif self._held_count:
            self._release(self._held_count)
