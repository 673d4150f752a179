"""The optimizer's settings (AdamW with linear warm-up) and what one step reports."""
from __future__ import annotations

from dataclasses import dataclass

from protocol.messages import RunSpec


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    warmup_steps: int = 10
    max_grad_norm: float = 1.0        # <= 0 disables clipping
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8

    @classmethod
    def from_spec(cls, spec: RunSpec) -> OptimConfig:
        return cls(lr=spec.learning_rate, warmup_steps=spec.warmup_steps,
                   max_grad_norm=spec.max_grad_norm)

    def lr_at(self, step: int) -> float:
        """Linear warm-up over warmup_steps, then constant."""
        if self.warmup_steps <= 0:
            return self.lr
        return self.lr * min(1.0, (step + 1) / self.warmup_steps)


@dataclass(frozen=True)
class StepStats:
    step: int                         # index of this step (0-based)
    lr: float
    samples: int                      # samples normalised over
    microbatches: int                 # local backwards that completed
    grad_norm: float                  # after normalisation, before clipping
    skipped: bool                     # no samples, or a non-finite gradient norm
    loss_mean: float | None           # origin only: mean loss of completed microbatches
    dropped: int                      # stash entries discarded (stale after the update)
