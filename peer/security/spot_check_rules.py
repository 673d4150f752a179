"""Spot checks, the pure pieces: which microbatches to recompute, and whether two replicas'
outputs agree. The pipeline wiring is peer/pipeline/spot_checks.py.

The sampling rule is keyed by a secret only the checking peer knows, so a cheating peer cannot
predict which of its outputs will be checked (a rule keyed by the public run seed could be).
"""
import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass

import torch

from peer.compute.quantise import blocks_of, channel_major
from protocol.quantised import LEVELS, QMAX
from protocol.spot_checks import SpotCheckReport

DEFAULT_RTOL = 1e-3   # replicas hold averaged (equal up to fp32 summation order) parameters


class SpotSampler:
    def __init__(self, rate: float, secret: bytes | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"spot-check rate must be in [0, 1], got {rate}")
        self.rate = rate
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    def should_check(self, epoch: int, iteration: int, microbatch_id: int, stage: int) -> bool:
        if self.rate <= 0.0:
            return False
        message = f"{epoch}/{iteration}/{microbatch_id}/{stage}".encode()
        draw = int.from_bytes(hmac.new(self.secret, message, hashlib.sha256).digest()[:8], "big")
        return draw < self.rate * 2**64


@dataclass(frozen=True)
class Comparison:
    passed: bool
    relative_error: float


def compare_outputs(suspect: torch.Tensor, reference: torch.Tensor, rtol: float = DEFAULT_RTOL,
                    codec: str | None = None, block: int = 0, steps: float = 0.5,
                    offsets: bool = False, channels: bool = False) -> Comparison:
    """Relative L2 error of `suspect` against `reference` (the checker's recomputation).

    `codec` (int8/int4): `suspect` arrived quantised in blocks of `block` values, so each value
    may honestly sit up to half a quantisation step from the true output; only the part of the
    difference beyond that half step counts (an honest peer's excess is the float noise
    between replicas, as without compression). `steps`: 1.0 for tensors rounded
    stochastically (backward gradients, peer/pipeline/wire.py), which may sit a whole step off.
    `offsets`: min/max blocks, whose step is the block's range / LEVELS (far finer than absmax's
    where a block's values share a sign: absmax's step there would hide that much more).
    `channels`: the blocks ran along channels (Quantised.channels), so the steps are theirs."""
    if suspect.shape != reference.shape:
        return Comparison(False, math.inf)
    a, b = suspect.detach().double(), reference.detach().double()
    if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(b).all()):
        return Comparison(False, math.inf)
    diff = a - b
    if codec is not None and block > 0:
        flat = channel_major if channels and a.ndim >= 2 else (lambda x: x.reshape(-1))
        diff = _beyond_steps(flat(diff), flat(a), flat(b), codec, block, steps, offsets)
    error = float(torch.linalg.vector_norm(diff) / max(float(torch.linalg.vector_norm(b)), 1e-12))
    return Comparison(error <= rtol, error)


def _beyond_steps(diff: torch.Tensor, a: torch.Tensor, b: torch.Tensor, codec: str, block: int,
                  steps: float, offsets: bool) -> torch.Tensor:
    """|diff| less `steps` quantisation steps of its block (the larger of the two tensors'
    block absmax / QMAX, or with offsets block max - min / LEVELS), at least 0."""
    def extent(x):
        # min/max blocks padded as the sender pads them (repeating the last value): no wider
        if not offsets:
            return blocks_of(x, block).abs().amax(dim=1)
        rows = blocks_of(x, block, repeat_last=True)
        return rows.amax(dim=1) - rows.amin(dim=1)

    step = torch.maximum(extent(a), extent(b)) / (LEVELS[codec] if offsets else QMAX[codec])
    excess = (blocks_of(diff, block).abs() - steps * step[:, None]).clamp_(min=0)
    return excess.reshape(-1)[:diff.numel()]


def report(comparison: Comparison, suspect: str, checker: str, epoch: int, iteration: int,
           microbatch_id: int, stage: int, kind: str = "forward") -> SpotCheckReport:
    error = comparison.relative_error if math.isfinite(comparison.relative_error) else 1e300
    return SpotCheckReport(suspect, checker, epoch, iteration, microbatch_id, stage, error, comparison.passed, kind)
