"""Cutting the decoder into stages of consecutive layers.

Stage 0 is special (SkipPipe): it owns the token embedding, its own block of layers, and the
final norm + LM head + loss, because every microbatch starts and ends at a stage-0 node.
Parameters come from model.init_part keyed by global layer index, so replicas of a stage start
identical and the assembled stages equal model.Decoder built from the same seed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from peer.compute.model import Decoder, Layers, ModelConfig, lm_loss, new_block, new_embedding, new_head


def layer_ranges(num_layers: int, num_stages: int,
                 stage_sizes: Sequence[int] = ()) -> list[tuple[int, int]]:
    """[(start, end)) of global layer indices per stage.

    Without stage_sizes the split is as even as possible; leftover layers go to the *last*
    stages, because stage 0 also carries the embedding, head and loss.
    """
    if num_stages < 1:
        raise ValueError("num_stages must be >= 1")
    if stage_sizes:
        sizes = list(stage_sizes)
        if len(sizes) != num_stages:
            raise ValueError(f"stage_sizes has {len(sizes)} entries for {num_stages} stages")
        if any(s < 1 for s in sizes):
            raise ValueError(f"every stage needs at least one layer: {sizes}")
        if sum(sizes) != num_layers:
            raise ValueError(f"stage_sizes sum to {sum(sizes)}, the model has {num_layers} layers")
    else:
        if num_stages > num_layers:
            raise ValueError(f"{num_stages} stages for only {num_layers} layers")
        base, extra = divmod(num_layers, num_stages)
        sizes = [base + (1 if s >= num_stages - extra else 0) for s in range(num_stages)]
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


class StageModule(nn.Module):
    """One stage: its layers, plus embedding / final norm / head when it is stage 0."""

    def __init__(self, config: ModelConfig, stage: int, layer_range: tuple[int, int], seed: int,
                 on_layer: Callable[[], None] | None = None):
        super().__init__()
        self.config, self.stage = config, stage
        self.layer_start, self.layer_end = layer_range
        self.layers = Layers(config, 0)
        for i in range(*layer_range):      # one by one: a large stage takes a while (progress)
            self.layers.blocks.append(new_block(config, seed, i))
            if on_layer is not None:
                on_layer()
        if stage == 0:
            self.embed = new_embedding(config, seed)
            self.norm, self.head = new_head(config, seed)

    @property
    def is_origin(self) -> bool:
        return self.stage == 0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, dim) -> hidden (B, T, dim) through this stage's layers."""
        return self.layers(hidden)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))

    def head_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head + mean token cross-entropy (stage 0 only)."""
        return lm_loss(self.logits(hidden), targets)

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.norm.weight, self.head.weight]

    def global_name(self, local: str) -> str:
        """'layers.blocks.<local i>.x' -> 'layers.<global i>.x' (the Decoder's naming)."""
        if not local.startswith("layers.blocks."):
            return local
        index, rest = local[len("layers.blocks."):].split(".", 1)
        return f"layers.{self.layer_start + int(index)}.{rest}"

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(self.global_name(n), p) for n, p in self.named_parameters()]

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """State with global layer indices, comparable to Decoder.global_state_dict."""
        return {self.global_name(n): t for n, t in self.state_dict().items()}


def build_stage(config: ModelConfig, stage: int, num_stages: int, seed: int,
                stage_sizes: Sequence[int] = (), on_layer: Callable[[], None] | None = None) -> StageModule:
    ranges = layer_ranges(config.n_layers, num_stages, stage_sizes)
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} outside 0..{num_stages - 1}")
    return StageModule(config, stage, ranges[stage], seed, on_layer)


def check_stage_order(stage_order: Sequence[int], num_stages: int) -> None:
    if not stage_order or stage_order[0] != 0:
        raise ValueError(f"a route starts at stage 0: {list(stage_order)}")
    if len(set(stage_order)) != len(stage_order):
        raise ValueError(f"a route visits each stage at most once: {list(stage_order)}")
    if any(not 0 <= s < num_stages for s in stage_order):
        raise ValueError(f"route {list(stage_order)} names a stage outside 0..{num_stages - 1}")


def reference_forward(config: ModelConfig, seed: int, tokens: torch.Tensor, targets: torch.Tensor,
                      stage_order: Sequence[int], num_stages: int,
                      stage_sizes: Sequence[int] = (), model: Decoder | None = None) -> torch.Tensor:
    """Single-process loss of one route: embed, the stage blocks in `stage_order`, head + loss.

    Builds a Decoder from `seed` (or reuses `model`); with the full in-order route this is
    exactly Decoder.forward. Returns the loss tensor (backward-able).
    """
    check_stage_order(stage_order, num_stages)
    ranges = layer_ranges(config.n_layers, num_stages, stage_sizes)
    model = model if model is not None else Decoder(config, seed)
    hidden = model.embed(tokens)
    for stage in stage_order:
        start, end = ranges[stage]
        hidden = model.layers(hidden, start, end)
    return lm_loss(model.head(model.norm(hidden)), targets)
