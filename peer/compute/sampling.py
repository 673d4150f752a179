"""Sampling a continuation with our own model code, through all stages or with some omitted.

Works on the per-stage modules of a checkpoint folder or on one Decoder (an exported folder)
with its stage split, so that `generate --omit F` can show what SkipPipe's training buys:
the model still writes sensible text with stages left out, as it does in eval's perplexity.
No KV cache: the whole window is recomputed per token, which is fine for the sizes trained
here and keeps the code the training forward itself.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from peer.compute.model import Decoder


class StagedModel:
    """embed -> the kept stages' layers, in order -> final norm + head."""

    def __init__(self, config, embed, stage_fns: Sequence, head):
        self.config, self.embed, self.stage_fns, self.head = config, embed, list(stage_fns), head

    @property
    def num_stages(self) -> int:
        return len(self.stage_fns)

    @classmethod
    def from_stages(cls, stages) -> StagedModel:
        return cls(stages[0].config, stages[0].embed_tokens, stages, stages[0].logits)

    @classmethod
    def from_decoder(cls, model: Decoder, stage_ends: Sequence[int]) -> StagedModel:
        ends = list(stage_ends) or [model.config.n_layers]
        starts = [0, *ends[:-1]]
        fns = [lambda h, a=a, b=b: model.layers(h, a, b) for a, b in zip(starts, ends)]
        return cls(model.config, model.embed, fns, lambda h: model.head(model.norm(h)))

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, keep: Sequence[int]) -> torch.Tensor:
        hidden = self.embed(tokens)
        for s in keep:
            hidden = self.stage_fns[s](hidden)
        return self.head(hidden)


def filter_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (nucleus)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    before = sorted_p.cumsum(-1) - sorted_p          # mass of the tokens ranked above
    sorted_p[before >= top_p] = 0.0                  # the top token always stays
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


@torch.no_grad()
def generate(model: StagedModel, prompt: list[int], max_new_tokens: int, keep: Sequence[int], *,
             temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, vocab_limit: int | None = None,
             eos_id: int | None = None) -> list[int]:
    """Sampled continuation ids (stops at EOS, which is not returned). temperature 0: greedy.
    Ids >= vocab_limit (the embedding's padding rows) are never sampled."""
    gen = torch.Generator().manual_seed(seed)
    ids, out = list(prompt), []
    window = model.config.max_seq_len
    for _ in range(max_new_tokens):
        logits = model.logits(torch.tensor([ids[-window:]]), keep)[0, -1].float()
        if vocab_limit is not None:
            logits[vocab_limit:] = float("-inf")
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            probs = filter_top_p(torch.softmax(logits / temperature, -1), top_p)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        if nxt == eos_id:
            break
        ids.append(nxt)
        out.append(nxt)
    return out
