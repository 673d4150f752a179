"""A LLaMA-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention).

Readable in one sitting on purpose. Every parameter is initialised from a generator seeded by
(seed, part name), where a part is "embed", "head", "norm" or "layer.<global index>", so that
any subset of layers built anywhere (a stage, a replica, a single-process reference) gets
bit-identical starting weights. See init_part / seeded_generator.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The architecture (ModelConfig, presets, config.json parsing) is torch-free, shared with the
# coordinator; re-exported here because this is where the model's users look for it.
from modelconfig import BYTE_VOCAB_SIZE, CONFIGS, ModelConfig, get_config, spec_model  # noqa: F401


def spec_config(spec) -> ModelConfig:
    """The architecture a run spec names: a preset, or the full config the coordinator sent."""
    return spec_model(spec.model, spec.model_config)


def count_parameters(config: ModelConfig, layers: int | None = None,
                     with_embed_head: bool = True) -> int:
    """Analytic parameter count (no allocation), for the whole model or `layers` blocks."""
    d, kv = config.dim, config.n_kv_heads * config.head_dim
    attn = 2 * d * d + 2 * d * kv                   # wq, wo, wk, wv
    mlp = 3 * d * config.ffn_hidden                 # gate, up, down
    block = attn + mlp + 2 * d                      # + two RMSNorm weights
    n = (config.n_layers if layers is None else layers) * block
    if with_embed_head:
        n += 2 * config.vocab_size * d + d          # embedding, untied head, final norm
    return n


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 for stability under bf16 autocast.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs)
    angles = torch.cat([angles, angles], dim=-1)    # (T, head_dim), "rotate half" layout
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd); cos/sin: (T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Grouped-query: each kv head serves n_heads / n_kv_heads query heads. Explicit
        # repeat (rather than sdpa's enable_gqa) keeps torch >= 2.3 working.
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(c.dim, c.ffn_hidden, bias=False)
        self.up = nn.Linear(c.dim, c.ffn_hidden, bias=False)
        self.down = nn.Linear(c.ffn_hidden, c.dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn = Attention(c)
        self.mlp_norm = RMSNorm(c.dim, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Layers(nn.Module):
    """A run of consecutive blocks plus the rotary tables they share (not saved in state)."""

    def __init__(self, c: ModelConfig, count: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(c) for _ in range(count))
        cos, sin = rotary_tables(c.head_dim, c.max_seq_len, c.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
        t = x.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks[start:end]:
            x = block(x, cos, sin)
        return x


def seeded_generator(seed: int, part: str) -> torch.Generator:
    """A CPU generator that depends only on (seed, part): stable across processes/machines."""
    digest = hashlib.sha256(f"skippipe-init:{seed}:{part}".encode()).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@torch.no_grad()
def init_part(module: nn.Module, c: ModelConfig, seed: int, part: str) -> None:
    """Initialise every parameter of `module` from (seed, part) in named-parameter order.

    Norm weights are ones; residual output projections (wo, down) get the GPT-2 scaling
    1/sqrt(2 * n_layers) so deep stacks start with small residual updates.
    """
    gen = seeded_generator(seed, part)
    for name, p in module.named_parameters():
        if p.ndim == 1:                             # only RMSNorm weights are 1-D
            p.fill_(1.0)
            continue
        std = c.init_std
        if name.endswith(("wo.weight", "down.weight")):
            std /= math.sqrt(2 * c.n_layers)
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


def new_block(c: ModelConfig, seed: int, layer_index: int) -> Block:
    block = Block(c)
    init_part(block, c, seed, f"layer.{layer_index}")
    return block


def new_embedding(c: ModelConfig, seed: int) -> nn.Embedding:
    emb = nn.Embedding(c.vocab_size, c.dim)
    init_part(emb, c, seed, "embed")
    return emb


def new_head(c: ModelConfig, seed: int) -> tuple[RMSNorm, nn.Linear]:
    norm, head = RMSNorm(c.dim, c.norm_eps), nn.Linear(c.dim, c.vocab_size, bias=False)
    init_part(head, c, seed, "head")
    return norm, head


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Decoder(nn.Module):
    """The full model in one process: the single-process reference for the stage split."""

    def __init__(self, c: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = c
        self.embed = new_embedding(c, seed)
        self.layers = Layers(c, 0)
        self.layers.blocks.extend(new_block(c, seed, i) for i in range(c.n_layers))
        self.norm, self.head = new_head(c, seed)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        """Returns logits (B, T, vocab) and the loss (None without targets)."""
        logits = self.head(self.norm(self.layers(self.embed(tokens))))
        return logits, (None if targets is None else lm_loss(logits, targets))

    @staticmethod
    def global_name(local: str) -> str:
        return local.replace("layers.blocks.", "layers.", 1)

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(self.global_name(n), p) for n, p in self.named_parameters()]

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """Names shared with StageModule: embed.*, layers.<i>.*, norm.*, head.*."""
        return {self.global_name(n): t for n, t in self.state_dict().items()}
