"""Which samples each microbatch trains: one global sample cursor for the whole swarm.

A dataset's training tokens are cut into samples of seq_len + 1 tokens that overlap by one
token (every token is a target exactly once), inside each shard file. A *global position*
p counts samples from the start of training: epoch p // N (N samples per epoch), and within
the epoch, shard files are visited in a seeded order and each file's samples in a seeded
order. So at any moment the swarm reads one file (a volunteer downloads the shards as the
cursor reaches them), and within an epoch every sample comes exactly once.

Which positions an iteration trains is fixed by the schedule that covers it: its
`data_base` (the first fresh position at its `start_iteration`) and `data_retry` (positions
lost earlier, trained first). Every microbatch of the schedule, in microbatch-id order,
takes the next `microbatch_samples` positions. Origins and the coordinator compute the same
positions from the same schedule, with no message per iteration; the coordinator carries a
lost microbatch's positions into the next schedule's `data_retry`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class DataCursor:
    """The sample positions of the iterations one schedule covers."""

    base: int                       # first fresh position at start_iteration
    retry: tuple[int, ...]          # positions lost earlier, trained before fresh ones
    start_iteration: int
    samples_per_iteration: int      # every microbatch of the schedule x its samples

    def __post_init__(self):
        if self.base < 0 or self.start_iteration < 0 or self.samples_per_iteration < 0:
            raise ValueError("a data cursor's base, start and samples must be >= 0")

    def _at_index(self, index: int) -> int:
        return self.retry[index] if index < len(self.retry) else self.base + index - len(self.retry)

    def positions(self, iteration: int, ordinal: int, samples: int) -> list[int]:
        """The positions microbatch number `ordinal` (in id order) of `iteration` trains."""
        if iteration < self.start_iteration:
            raise ValueError(f"iteration {iteration} is before this cursor's start {self.start_iteration}")
        first = (iteration - self.start_iteration) * self.samples_per_iteration + ordinal * samples
        return [self._at_index(first + j) for j in range(samples)]

    def at(self, iteration: int) -> tuple[int, tuple[int, ...]]:
        """(next fresh position, retries not yet handed out) at the start of `iteration`."""
        used = max(0, iteration - self.start_iteration) * self.samples_per_iteration
        left = self.retry[used:]
        return self.base + max(0, used - len(self.retry)), left


def compress_positions(positions) -> tuple[int, ...]:
    """Sorted positions as flat (start, count) pairs: reports stay small for contiguous runs."""
    out: list[int] = []
    for p in sorted(positions):
        if out and out[-2] + out[-1] == p:
            out[-1] += 1
        else:
            out += [p, 1]
    return tuple(out)


def expand_positions(pairs) -> list[int]:
    if len(pairs) % 2:
        raise ValueError("position ranges come as (start, count) pairs")
    return [start + k for start, count in zip(pairs[::2], pairs[1::2]) for k in range(count)]


class SampleOrder:
    """Global position -> (shard file index, sample index in that file), seeded per epoch."""

    def __init__(self, samples_per_shard: list[int], seed: int):
        if not samples_per_shard or min(samples_per_shard) < 0 or sum(samples_per_shard) == 0:
            raise ValueError("the dataset has no training samples (shards shorter than seq_len + 1 tokens?)")
        self.samples_per_shard = list(samples_per_shard)
        self.per_epoch = sum(samples_per_shard)
        self.seed = seed

    def locate(self, position: int) -> tuple[int, int]:
        if position < 0:
            raise ValueError("sample positions are >= 0")
        epoch, k = divmod(position, self.per_epoch)
        order, ends = self._shard_order(epoch)
        slot = int(np.searchsorted(ends, k, side="right"))
        shard = order[slot]
        within = k - (ends[slot - 1] if slot else 0)
        return shard, int(self._sample_order(epoch, shard)[within])

    def epoch_of(self, position: int) -> int:
        return position // self.per_epoch

    def _shard_order(self, epoch: int):
        return _shard_order(tuple(self.samples_per_shard), self.seed, epoch)

    def _sample_order(self, epoch: int, shard: int) -> np.ndarray:
        return _permutation(self.samples_per_shard[shard], self.seed, epoch, shard)


@lru_cache(maxsize=8)
def _shard_order(counts: tuple[int, ...], seed: int, epoch: int):
    order = _permutation(len(counts), seed, epoch, -1).tolist()
    return order, np.cumsum([counts[s] for s in order])


@lru_cache(maxsize=16)
def _permutation(n: int, seed: int, epoch: int, shard: int) -> np.ndarray:
    digest = hashlib.sha256(f"skippipe-samples:{seed}:{epoch}:{shard}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little")).permutation(n)


def schedule_cursor(schedule, microbatch_samples: int) -> DataCursor:
    """The cursor a protocol Schedule defines (its routes, start and data fields)."""
    return DataCursor(base=schedule.data_base, retry=tuple(schedule.data_retry),
                      start_iteration=schedule.start_iteration,
                      samples_per_iteration=len(schedule.routes) * microbatch_samples)


def microbatch_positions(schedule, microbatch_samples: int, iteration: int, microbatch_id: int) -> list[int]:
    """The positions microbatch `microbatch_id` of `iteration` trains under `schedule`."""
    ordinal = sorted(r.microbatch_id for r in schedule.routes).index(microbatch_id)
    return schedule_cursor(schedule, microbatch_samples).positions(iteration, ordinal, microbatch_samples)
