"""Offline study of wire codecs (issue 27) and of the delayed gradient exchange (issue 26):
bench/convergence.py's training in one process, with fake quantisation where a microbatch crosses
a hop, so a variant costs ~20-40 s, not a swarm.

Same model (tiny, 5 stages), SkipPipe k = 1/3 routes from the planner, the same data per
origin and iteration, the replicas' int8 gradient shares, AdamW with warm-up and per-stage
clipping; then the held-out loss with all stages in order. What differs from the swarm is only
float summation order (and that the first tensors to each peer are quantised too). Each variant
names what the forward activations and the backward gradients go through, and on which hops:

  int8, int4          per 64 values, to nearest (forward) / stochastic (backward), as sent: int8
                      absmax both ways, int4 min/max blocks forward and absmax back; in channel
                      blocks (64 tokens of one channel, protocol 1.12) both ways
  int4_rows           int4 in blocks along a token (as peers sent it before protocol 1.12);
                      int4_rows_back: channel blocks forward, rows back
  int4_absmax         int4 with absmax blocks forward too, in rows (as sent before protocol 1.11)
  int4_fwd            int4 (min/max, channel blocks) on the activations only; int4_fwd_absmax: absmax rows;
  int4_head, int4_body  absmax int4 activations on the hop into the head only / on every hop
                      but that one; int4_fwd_sr: absmax with stochastic rounding forward too
  jitter              floats off by ~1e-5 (the chaos control, bench/support/wire_jitter.py)
  delayed             floats; every stage steps with the previous iteration's averaged gradient
                      (`--gradient-exchange delayed`); delayed_stage0: stage 0 only (the data
                      nodes' exchange, the one on SkipPipe's critical path); delayed_rest: the others;
  delayed_extrap      delayed, stepping with the averages extrapolated one iteration on:
                      g(i-1) + 2 (g(i-1) - g(i-2)), from averaged gradients only (replicas stay identical)

Also prints the relative squared error of int4 layouts on trained activations (--mse).

  python bench/codec_study.py [--variants off,int8,int4] [--seeds 1] [--first-seed 0] [--steps 120] [--mse]
Last line: RESULT loss_<variant>=... (means over the seeds) load_start=.. load_end=..
"""
import argparse
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.*
from bench.convergence import schedule_for  # noqa: E402
from bench.support.wire_jitter import jitter  # noqa: E402
from peer.compute.model import get_config  # noqa: E402
from peer.compute.optim import OptimConfig  # noqa: E402
from peer.compute.quantise import quantise  # noqa: E402
from peer.compute.stages import StageModule, layer_ranges  # noqa: E402
from peer.data import TextDataset, load_corpus  # noqa: E402
from peer.evaluate import perplexity  # noqa: E402
from peer.pipeline import plan_view as pv  # noqa: E402
from peer.pipeline.share_codec import encode_share  # noqa: E402

STAGES, SAMPLES, SEQ = 5, 8, 64


def codec(name: str, stochastic: bool = False, offsets: bool = False, channels: bool = False):
    gen = torch.Generator().manual_seed(0) if stochastic else None
    return lambda x: quantise(x, name, 64, gen, offsets, channels)[2]


def everywhere(j, n):
    return True


VARIANTS = {   # name: (forward, backward, which hops: f(hop index, hops))
    "off": (None, None, everywhere),
    "jitter": (jitter, jitter, everywhere),
    "int8": (codec("int8", channels=True), codec("int8", True, channels=True), everywhere),
    "int4": (codec("int4", offsets=True, channels=True), codec("int4", True, channels=True), everywhere),
    "int4_rows": (codec("int4", offsets=True), codec("int4", True), everywhere),
    "int4_rows_back": (codec("int4", offsets=True, channels=True), codec("int4", True), everywhere),
    "int4_absmax": (codec("int4"), codec("int4", True), everywhere),
    "int4_fwd": (codec("int4", offsets=True, channels=True), None, everywhere),
    "int4_fwd_absmax": (codec("int4"), None, everywhere),
    "int4_head": (codec("int4"), None, lambda j, n: j == n - 1),
    "int4_body": (codec("int4"), None, lambda j, n: j < n - 1),
    "int4_fwd_sr": (codec("int4", True), None, everywhere),
}
# exchange variants (floats on the wire): the stages that step with the iteration before's average
DELAYED_STAGES = {"delayed": set(range(STAGES)), "delayed_stage0": {0}, "delayed_rest": set(range(1, STAGES)),
                  "delayed_extrap": set(range(STAGES))}
VARIANTS.update({name: VARIANTS["off"] for name in DELAYED_STAGES})
EXTRAPOLATE = {"delayed_extrap": 2.0}


def extrapolated(shares: dict, before: dict, alpha: float) -> dict:
    """Each share moved alpha times its change since the iteration before (a share new then: as is)."""
    return {k: v + alpha * (v - before[k]) if k in before else v for k, v in shares.items()}


class Hop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd):
        ctx.bwd = bwd
        return fwd(x) if fwd else x

    @staticmethod
    def backward(ctx, g):
        return (ctx.bwd(g) if ctx.bwd else g), None, None


def routes_of(seed: int):
    """(data shard, local index, stages, peers) of every microbatch, as the swarm's origins see them."""
    a = argparse.Namespace(nodes=10, seed=seed, stages=STAGES, samples=SAMPLES, microbatches=4, seq_len=SEQ,
                           data_nodes=2)
    schedule = schedule_for(a, 1 / 3)
    out = []
    for origin in pv.replicas(schedule, 0):
        shard, _ = pv.data_shard(schedule, origin)
        for local, r in enumerate(pv.origin_routes(schedule, origin)):
            out.append((shard, local, [h.stage for h in r.hops], [h.peer for h in r.hops]))
    return out


def microbatch(stages, tokens, targets, route, variant, seen=None):
    fwd, bwd, hops_on = VARIANTS[variant]
    h = stages[0].layers(stages[0].embed_tokens(tokens))
    hops = route[1:] + [0]
    for j, s in enumerate(hops):
        if seen is not None:
            seen.append(h.detach())
        if hops_on(j, len(hops)):
            h = Hop.apply(h, fwd, bwd)
        if s != 0:
            h = stages[s](h)
    (stages[0].head_loss(h, targets) * SAMPLES).backward()


def step(stages, opts, acc, cfg, it, samples, counts=None):
    """Every replica's share through the int8 share codec, summed, normalised, clipped, AdamW."""
    for s, (module, opt) in enumerate(zip(stages, opts)):
        shares = {peer: encode_share(v, "int8")[2] for (stage, peer), v in acc.items() if stage == s}
        if not shares:         # a delayed stage's first iteration: no update in flight yet
            continue
        # normalised by the samples this stage's replicas trained, as peers do (a delayed
        # stage's shares come without counts: the iteration's samples)
        total, offset = sum(shares.values()), 0
        samples = sum(counts[(s, peer)] for peer in shares) if counts else samples
        for p in module.parameters():
            p.grad = total[offset:offset + p.numel()].view_as(p) / samples
            offset += p.numel()
        torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(it)
        opt.step()
        opt.zero_grad(set_to_none=True)


def train(seed: int, variant: str, steps: int, seen=None) -> float:
    c = get_config("tiny")
    ranges = layer_ranges(c.n_layers, STAGES)
    stages = [StageModule(c, s, ranges[s], seed) for s in range(STAGES)]
    cfg = OptimConfig(lr=3e-3, warmup_steps=5, max_grad_norm=1.0)
    opts = [torch.optim.AdamW([{"params": [p for p in m.parameters() if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                               {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                              lr=cfg.lr_at(0), betas=cfg.betas, eps=cfg.eps) for m in stages]
    train_set, held = TextDataset(load_corpus()).split()
    shards = [train_set.shard(i, 2) for i in range(2)]
    routes = routes_of(seed)
    delayed, in_flight, before = DELAYED_STAGES.get(variant, set()), {}, {}
    alpha = EXTRAPOLATE.get(variant, 0.0)
    for it in range(steps):
        acc, counts = {}, {}
        for shard, local, route, peers in routes:
            tokens, targets = shards[shard].batch(seed=seed, iteration=it, microbatch=local, samples=SAMPLES,
                                                  seq_len=SEQ)
            microbatch(stages, tokens, targets, route, variant, seen if it == steps - 1 else None)
            for s, peer in zip(route, peers):      # this replica's share of its stage's gradient
                counts[(s, peer)] = counts.get((s, peer), 0) + SAMPLES
                vec = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                                 for p in stages[s].parameters()])
                acc[(s, peer)] = acc.get((s, peer), 0) + vec
                for p in stages[s].parameters():
                    p.grad = None
        now = {k: v for k, v in acc.items() if k[0] not in delayed}
        # the delayed stages' shares of the iteration before (extrapolated one on, if the variant says so)
        now.update(extrapolated(in_flight, before, alpha) if alpha else in_flight)
        before, in_flight = in_flight, {k: v for k, v in acc.items() if k[0] in delayed}
        step(stages, opts, now, cfg, it, SAMPLES * len(routes), counts if not delayed else None)
    if in_flight:           # as peers flush at the run's end: every update applied
        step(stages, opts, in_flight, cfg, steps, SAMPLES * len(routes))
    held_out = list(held.eval_batches(samples=8, seq_len=SEQ, max_batches=16))
    with torch.no_grad():
        return math.log(perplexity([m.eval() for m in stages], tuple(range(STAGES)), held_out))


def asymmetric_int4(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    b = x.reshape(-1, block)
    lo, hi = b.amin(1, keepdim=True), b.amax(1, keepdim=True)
    s = ((hi - lo) / 15).clamp_min(1e-12)
    return (torch.round((b - lo) / s) * s + lo).view(x.shape)


def mse_table(seen: list[torch.Tensor]) -> None:
    x = torch.stack(seen)
    layouts = {"absmax64": lambda t: quantise(t, "int4", 64)[2], "absmax16": lambda t: quantise(t, "int4", 16)[2],
               "asymmetric64": asymmetric_int4, "minmax64_channels": lambda t: quantise(t, "int4", 64, None, True, True)[2]}
    print(f"trained activations: rms {float(x.pow(2).mean().sqrt()):.3f}, absmax {float(x.abs().max()):.3f}")
    for name, f in layouts.items():
        print(f"int4 {name}: relative squared error {float((f(x) - x).pow(2).mean() / x.pow(2).mean()):.5f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="off,int8,int4")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--first-seed", type=int, default=0, help="the first of --seeds seeds")
    p.add_argument("--mse", action="store_true", help="also the int4 layouts' error on the floats run's activations")
    args = p.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} CPUs)", flush=True)
    losses = {}
    for v in args.variants.split(","):
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; one of {list(VARIANTS)}")
        seen = [] if args.mse and v == "off" else None
        losses[v] = [train(seed, v, args.steps, seen) for seed in range(args.first_seed, args.first_seed + args.seeds)]
        print(f"{v}: held-out loss {sum(losses[v]) / len(losses[v]):.4f} "
              f"(seeds: {' '.join(f'{x:.4f}' for x in losses[v])})", flush=True)
        if seen:
            mse_table(seen)
    end = os.getloadavg()
    means = " ".join(f"loss_{v}={sum(x) / len(x):.4f}" for v, x in losses.items())
    print(f"RESULT {means} load_start={load[0]:.1f} load_end={end[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
