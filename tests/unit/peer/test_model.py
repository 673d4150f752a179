"""The decoder: configs, shapes, grouped-query attention, causality, deterministic init."""
import math

import pytest
import torch
import torch.nn.functional as F

from peer.compute.model import CONFIGS, Attention, Decoder, count_parameters, get_config, rotary_tables
from peer.compute.stages import build_stage, layer_ranges


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Small matmuls on a shared 2-core box are far slower multi-threaded (oversubscription).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


TINY = get_config("tiny")


def test_registry_and_error():
    assert {"tiny", "small", "500m", "1.5b"} <= set(CONFIGS)
    with pytest.raises(KeyError, match="tiny"):
        get_config("nope")


@pytest.mark.parametrize("name,low,high", [("500m", 0.45e9, 0.55e9), ("1.5b", 1.4e9, 1.6e9)])
def test_paper_sizes(name, low, high):
    c = get_config(name)
    assert low < count_parameters(c) < high
    assert c.n_kv_heads < c.n_heads


def test_count_matches_module():
    assert count_parameters(TINY) == sum(p.numel() for p in Decoder(TINY).parameters())
    stage = build_stage(TINY, 1, 3, seed=0)
    assert sum(p.numel() for p in stage.parameters()) == count_parameters(TINY, layers=2, with_embed_head=False)


def test_forward_shapes_and_loss():
    model = Decoder(TINY, seed=0)
    tokens = torch.randint(0, 256, (3, 20))
    logits, loss = model(tokens, tokens)
    assert logits.shape == (3, 20, TINY.vocab_size)
    # Near-uniform predictions at init: loss close to log(vocab).
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.5
    assert model(tokens)[1] is None


def test_gqa_matches_explicit_grouping():
    torch.manual_seed(0)
    attn = Attention(TINY)
    assert attn.wk.weight.shape == (TINY.n_kv_heads * TINY.head_dim, TINY.dim)
    b, t, h, kvh, hd = 2, 10, TINY.n_heads, TINY.n_kv_heads, TINY.head_dim
    x = torch.randn(b, t, TINY.dim)
    cos, sin = rotary_tables(hd, t, TINY.rope_theta)
    from peer.compute.model import apply_rotary
    q = apply_rotary(attn.wq(x).view(b, t, h, hd).transpose(1, 2), cos, sin)
    k = apply_rotary(attn.wk(x).view(b, t, kvh, hd).transpose(1, 2), cos, sin)
    v = attn.wv(x).view(b, t, kvh, hd).transpose(1, 2)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    heads = []
    for qh in range(h):
        kv = qh // (h // kvh)                  # query head -> its kv group
        s = q[:, qh] @ k[:, kv].transpose(-1, -2) / math.sqrt(hd)
        heads.append(F.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[:, kv])
    expected = attn.wo(torch.stack(heads, 1).transpose(1, 2).reshape(b, t, -1))
    assert torch.allclose(attn(x, cos, sin), expected, atol=1e-5)


def test_causal():
    model = Decoder(TINY, seed=1)
    tokens = torch.randint(0, 256, (1, 24))
    changed = tokens.clone()
    changed[0, 15:] = (changed[0, 15:] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens)[0], model(changed)[0]
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-6)
    assert not torch.allclose(a[:, 15:], b[:, 15:])


def test_deterministic_init():
    a, b = Decoder(TINY, seed=3).state_dict(), Decoder(TINY, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = Decoder(TINY, seed=4).state_dict()
    assert not torch.equal(a["embed.weight"], c["embed.weight"])
    # Distinct layers get distinct weights.
    assert not torch.equal(a["layers.blocks.0.attn.wq.weight"], a["layers.blocks.1.attn.wq.weight"])


@pytest.mark.parametrize("sizes", [(), (1, 2, 3)])
def test_stages_assemble_to_full_model(sizes):
    full = Decoder(TINY, seed=5).global_state_dict()
    assembled = {}
    for s in range(3):
        assembled.update(build_stage(TINY, s, 3, seed=5, stage_sizes=sizes).global_state_dict())
    assert assembled.keys() == full.keys()
    assert all(torch.equal(assembled[k], full[k]) for k in full)
    replica = build_stage(TINY, 1, 3, seed=5, stage_sizes=sizes).state_dict()
    again = build_stage(TINY, 1, 3, seed=5, stage_sizes=sizes).state_dict()
    assert all(torch.equal(replica[k], again[k]) for k in replica)


def test_layer_ranges():
    assert layer_ranges(6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert layer_ranges(7, 3) == [(0, 2), (2, 4), (4, 7)]     # extra layer away from stage 0
    assert layer_ranges(6, 3, (1, 2, 3)) == [(0, 1), (1, 3), (3, 6)]
    assert layer_ranges(24, 6) == [(i * 4, i * 4 + 4) for i in range(6)]
    for bad in [dict(num_stages=7), dict(num_stages=0), dict(num_stages=3, stage_sizes=(1, 2)),
                dict(num_stages=3, stage_sizes=(0, 3, 3)), dict(num_stages=3, stage_sizes=(2, 2, 3))]:
        with pytest.raises(ValueError):
            layer_ranges(6, **bad)
