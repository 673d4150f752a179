"""Training samples by global position (tokendata/cursor.py): what a stage-0 peer feeds its
microbatches. The tokens are a list of flat arrays, one per training shard (numpy memmaps of a
dataset folder, or the embedded corpus tokenised in memory)."""
from __future__ import annotations

import numpy as np
import torch

from tokendata.cursor import SampleOrder


class SampleSource:
    def __init__(self, shards: list[np.ndarray], seq_len: int, seed: int):
        if seq_len < 1:
            raise ValueError("seq_len must be >= 1")
        self.shards, self.seq_len = shards, seq_len
        # samples overlap by one token, so every token is a target exactly once per epoch
        self.order = SampleOrder([max(0, (len(s) - 1) // seq_len) for s in shards], seed)

    @property
    def samples_per_epoch(self) -> int:
        return self.order.per_epoch

    def window(self, position: int) -> np.ndarray:
        """The seq_len + 1 tokens of global sample `position`."""
        shard, k = self.order.locate(position)
        start = k * self.seq_len
        return np.asarray(self.shards[shard][start:start + self.seq_len + 1], dtype=np.int64)

    def batch(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, targets), int64 of shape (len(positions), seq_len)."""
        t = torch.from_numpy(np.stack([self.window(p) for p in positions]))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
