"""StageRunner across stages, in one process, against the single-process reference."""
import pytest
import torch

from peer.compute.errors import BadTensor, OutOfOrder, StashFull, UnknownMicrobatch, WrongStage
from peer.compute.model import Decoder, get_config
from peer.compute.runner import OptimConfig, StageRunner
from peer.compute.stages import build_stage, reference_forward
from protocol.errors import ErrorCode
from protocol.messages import RunSpec

TINY = get_config("tiny")
SEED, S, B, T = 7, 3, 2, 16
NO_CLIP = OptimConfig(lr=1e-2, warmup_steps=1, max_grad_norm=0.0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_runners(optim=NO_CLIP, **kw):
    return [StageRunner(build_stage(TINY, s, S, SEED), optim, **kw) for s in range(S)]


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    tok = torch.randint(0, 256, (B, T + 1), generator=g)
    return tok[:, :-1], tok[:, 1:]


def run_route(runners, key, route, tokens, targets):
    """Forward along route (starting at 0), head+loss at the origin, backward in reverse."""
    h = runners[0].forward_origin(key, tokens)
    for s in route[1:]:
        h = runners[s].forward(key, h)
    loss, g = runners[0].head_loss(key, h, targets)
    for s in reversed(route[1:]):
        g = runners[s].backward(key, g)
    runners[0].backward_origin(key, g)
    return loss


def normalised_grads(runners):
    out = {}
    for r in runners:
        for name, p in r.module.global_named_parameters():
            out[name] = p.grad / r.samples_this_step
    return out


def reference_grads(losses_weights, model):
    model.zero_grad(set_to_none=True)
    sum(w * l for l, w in losses_weights).backward(retain_graph=True)
    return {n: p.grad.clone() for n, p in model.global_named_parameters() if p.grad is not None}


def assert_grads_close(got, want, names=None):
    for n in names or want:
        assert torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-7), n


def test_full_route_equals_single_process_loss_grads_and_step():
    runners, model = make_runners(), Decoder(TINY, SEED)
    batches = [batch(0), batch(1)]
    losses = [run_route(runners, (0, m), (0, 1, 2), *batches[m]) for m in range(2)]
    tokens, targets = (torch.cat(x) for x in zip(*batches))
    _, ref_loss = model(tokens, targets)
    assert abs(sum(losses) / 2 - ref_loss.item()) < 1e-5
    assert all(r.samples_this_step == 2 * B for r in runners)
    assert_grads_close(normalised_grads(runners), reference_grads([(ref_loss, 1.0)], model))
    # One AdamW step on both sides, same hyper-parameters and weight-decay groups.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95))
    opt.step()
    stats = [r.step() for r in runners]
    assert stats[0].loss_mean == pytest.approx(sum(losses) / 2)
    assert all(not s.skipped and s.samples == 2 * B and s.microbatches == 2 for s in stats)
    full = model.global_state_dict()
    for r in runners:
        for n, t in r.module.global_state_dict().items():
            # Adam's first step is ~lr * sign(g): tiny float differences in g move it ~1e-6.
            assert torch.allclose(t, full[n], atol=2e-5), (n, (t - full[n]).abs().max())


@pytest.mark.parametrize("route", [(0, 2, 1), (0, 2), (0,)])
def test_reordered_and_skipped_routes_match_reference(route):
    runners, model = make_runners(), Decoder(TINY, SEED)
    tokens, targets = batch(3)
    loss = run_route(runners, (0, 0), route, tokens, targets)
    ref = reference_forward(TINY, SEED, tokens, targets, route, S, model=model)
    assert abs(loss - ref.item()) < 1e-5
    assert abs(ref.item() - reference_forward(TINY, SEED, tokens, targets, route, S).item()) < 1e-6
    want = reference_grads([(ref, 1.0)], model)
    got = normalised_grads([runners[s] for s in route])
    assert_grads_close(got, want, names=got.keys())
    skipped = set(range(S)) - set(route)
    assert all(runners[s].samples_this_step == 0 for s in skipped)


def test_normalised_by_samples_that_touched_the_stage():
    runners, model = make_runners(), Decoder(TINY, SEED)
    (ta, ya), (tb, yb) = batch(4), batch(5)
    run_route(runners, (0, 0), (0, 1, 2), ta, ya)
    run_route(runners, (0, 1), (0, 2), tb, yb)
    assert [r.samples_this_step for r in runners] == [2 * B, B, 2 * B]
    la = reference_forward(TINY, SEED, ta, ya, (0, 1, 2), S, model=model)
    lb = reference_forward(TINY, SEED, tb, yb, (0, 2), S, model=model)
    only_a = reference_grads([(la, 1.0)], model)
    mean_ab = reference_grads([(la, 0.5), (lb, 0.5)], model)
    got = normalised_grads(runners)
    stage1 = {n for n, _ in runners[1].module.global_named_parameters()}
    assert_grads_close(got, only_a, names=stage1)
    assert_grads_close(got, mean_ab, names=set(got) - stage1)


def test_stash_limit_ttl_unknown_and_drop():
    now = [0.0]
    r = StageRunner(build_stage(TINY, 1, S, SEED), max_stash=2, stash_ttl_s=10.0,
                    clock=lambda: now[0])
    h = torch.randn(B, T, TINY.dim)
    r.forward((0, 0), h)
    with pytest.raises(OutOfOrder):
        r.forward((0, 0), h)
    now[0] = 5.0
    r.forward((0, 1), h)
    with pytest.raises(StashFull) as e:
        r.forward((0, 2), h)
    assert e.value.code == ErrorCode.OVERLOADED
    assert r.evict_expired(now=10.5) == [(0, 0)]
    with pytest.raises(UnknownMicrobatch) as e:
        r.backward((0, 0), h)
    assert e.value.code == ErrorCode.UNKNOWN_MICROBATCH
    now[0] = 20.0                               # forward evicts expired entries itself
    r.forward((0, 2), h)
    assert r.stash_keys() == [(0, 2)]
    assert r.drop((0, 2)) and not r.drop((0, 2)) and r.stashed == 0
    assert r.samples_this_step == 0


def test_wrong_stage_and_order():
    origin, mid = make_runners()[:2]
    tok, tgt = batch(0)
    with pytest.raises(WrongStage):
        origin.forward((0, 0), torch.randn(B, T, TINY.dim))
    with pytest.raises(WrongStage):
        mid.forward_origin((0, 0), tok)
    h = origin.forward_origin((0, 0), tok)
    with pytest.raises(OutOfOrder):
        origin.backward_origin((0, 0), h)
    origin.head_loss((0, 0), h, tgt)
    with pytest.raises(OutOfOrder):
        origin.head_loss((0, 0), h, tgt)
    with pytest.raises(ValueError):
        mid.forward("0-0", h)


def test_bad_tensors_are_rejected_without_side_effects():
    origin, mid = make_runners()[:2]
    good = torch.randn(B, T, TINY.dim)
    nan = good.clone()
    nan[0, 0, 0] = float("nan")
    for bad in [good.double(), good[0], torch.randn(B, T, TINY.dim + 1), nan,
                torch.randn(B, TINY.max_seq_len + 1, TINY.dim), good.tolist()]:
        with pytest.raises(BadTensor):
            mid.forward((0, 0), bad)
    assert mid.stashed == 0
    out = mid.forward((0, 0), good)
    inf = torch.ones_like(out)
    inf[1, 2, 3] = float("inf")
    with pytest.raises(BadTensor) as e:
        mid.backward((0, 0), inf)
    assert e.value.code == ErrorCode.NON_FINITE and isinstance(e.value, ValueError)
    with pytest.raises(BadTensor, match="shape"):
        mid.backward((0, 0), torch.ones(B, T - 1, TINY.dim))
    assert mid.stashed == 1 and mid.samples_this_step == 0
    assert all(p.grad is None for p in mid.module.parameters())
    mid.backward((0, 0), torch.ones_like(out))        # the entry survived intact
    assert mid.samples_this_step == B
    tok, tgt = batch(0)
    for bad in [tok.int(), tok + 1000, -tok - 1, tok[0]]:
        with pytest.raises(BadTensor):
            origin.forward_origin((0, 0), bad)
    h = origin.forward_origin((0, 0), tok)
    with pytest.raises(BadTensor):
        origin.head_loss((0, 0), h, tgt[:, :-1])
    with pytest.raises(BadTensor):
        origin.head_loss((0, 0), h[:1], tgt[:1])


def test_step_clips_warms_up_and_skips_empty():
    optim = OptimConfig(lr=1e-2, warmup_steps=4, max_grad_norm=0.5)
    r = StageRunner(build_stage(TINY, 1, S, SEED), optim)
    before = r.parameter_vector()
    stats = r.step()
    assert stats.skipped and stats.samples == 0 and torch.equal(before, r.parameter_vector())
    out = r.forward((1, 0), torch.randn(B, T, TINY.dim))
    r.backward((1, 0), torch.ones_like(out) * 100)
    r.forward((1, 1), torch.randn(B, T, TINY.dim))    # stale after the step: discarded
    stats = r.step()
    assert stats.step == 1 and stats.lr == pytest.approx(1e-2 * 2 / 4)
    assert stats.grad_norm > 0.5 and not stats.skipped and stats.dropped == 1
    assert r.stashed == 0 and r.samples_this_step == 0
    assert not torch.equal(before, r.parameter_vector())
    assert all(p.grad is None for p in r.module.parameters())


def test_replica_averaging_via_grad_vector():
    replicas = [StageRunner(build_stage(TINY, 2, S, SEED), NO_CLIP) for _ in range(2)]
    assert torch.equal(replicas[0].parameter_vector(), replicas[1].parameter_vector())
    for i, r in enumerate(replicas):                  # replica 0 sees 1 microbatch, 1 sees 2
        for m in range(i + 1):
            out = r.forward((0, m), torch.randn(B, T, TINY.dim))
            r.backward((0, m), torch.randn_like(out))
    total = sum(r.grad_vector() for r in replicas)
    samples = sum(r.samples_this_step for r in replicas)
    assert samples == 3 * B
    for r in replicas:
        r.set_grad_vector(total, samples)
        assert r.step().samples == 3 * B
    assert torch.equal(replicas[0].parameter_vector(), replicas[1].parameter_vector())
    with pytest.raises(BadTensor):
        replicas[0].set_grad_vector(total[:-1], 1)
    with pytest.raises(BadTensor):
        replicas[0].set_grad_vector(total * float("nan"), 1)


def test_state_dict_round_trip_and_mismatch():
    a = StageRunner(build_stage(TINY, 1, S, SEED), NO_CLIP)
    out = a.forward((0, 0), torch.randn(B, T, TINY.dim))
    a.backward((0, 0), torch.randn_like(out))
    a.step()
    b = StageRunner(build_stage(TINY, 1, S, seed=99), NO_CLIP)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.parameter_vector(), b.parameter_vector()) and b.step_count == 1
    g = torch.randn(a.num_parameters())
    for r in (a, b):                                    # Adam moments travelled too
        r.set_grad_vector(g, B)
        r.step()
    assert torch.equal(a.parameter_vector(), b.parameter_vector())
    with pytest.raises(ValueError):
        StageRunner(build_stage(TINY, 2, S, SEED)).load_state_dict(a.state_dict())


def test_from_spec():
    spec = RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, seed=SEED,
                   learning_rate=3e-4, warmup_steps=5, max_grad_norm=2.0)
    r = StageRunner.from_spec(spec, 0, max_stash=4)
    assert r.is_origin and r.max_stash == 4 and r.optim_config.lr == 3e-4
    ref = build_stage(TINY, 0, 3, SEED).state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in r.module.state_dict().items())
