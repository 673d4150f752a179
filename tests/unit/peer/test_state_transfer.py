"""Late-join state transfer: a fresh replica loaded from a flat state trains identically."""
import pytest
import torch

from protocol.messages import RunSpec

from peer.compute.runner import StageRunner
from peer.compute.state_transfer import flat_state, load_flat_state, state_size

SPEC = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, seed=5, microbatch_samples=2,
               seq_len=8, learning_rate=1e-2, warmup_steps=2)


def train_step(runner: StageRunner, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, runner.module.config.dim, generator=gen)
    out = runner.forward((0, seed), x)
    runner.backward((0, seed), torch.randn(out.shape, generator=gen))
    runner.step()


def test_copied_state_keeps_replicas_identical_through_later_steps():
    donor = StageRunner.from_spec(SPEC, 1)
    for s in range(3):
        train_step(donor, s)
    joiner = StageRunner.from_spec(SPEC, 1)
    assert not torch.equal(joiner.parameter_vector(), donor.parameter_vector())
    vector, steps, adam = flat_state(donor)
    assert vector.numel() == state_size(donor) and steps == 3 and adam == 3
    load_flat_state(joiner, vector.clone(), steps, adam)
    assert torch.equal(joiner.parameter_vector(), donor.parameter_vector())
    for s in range(3, 5):  # same inputs: identical only if moments and step counts came along
        train_step(donor, s)
        train_step(joiner, s)
    assert torch.equal(joiner.parameter_vector(), donor.parameter_vector())
    assert joiner.step_count == donor.step_count == 5


def test_state_from_a_replica_that_never_stepped():
    donor, joiner = StageRunner.from_spec(SPEC, 1), StageRunner.from_spec(SPEC, 1)
    vector, steps, adam = flat_state(donor)
    assert (steps, adam) == (0, 0)
    load_flat_state(joiner, vector, steps, adam)
    train_step(donor, 0)
    train_step(joiner, 0)
    assert torch.equal(joiner.parameter_vector(), donor.parameter_vector())


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.full((10,), float("nan"))])
def test_rejects_wrong_size_or_non_finite_state(bad):
    runner = StageRunner.from_spec(SPEC, 1)
    if bad.numel() == 10:
        bad = torch.full((state_size(runner),), float("nan"))
    with pytest.raises(ValueError):
        load_flat_state(runner, bad, 1, 1)


def test_rejects_an_optimizer_state_that_would_poison_the_next_step():
    donor, joiner = StageRunner.from_spec(SPEC, 1), StageRunner.from_spec(SPEC, 1)
    train_step(donor, 0)
    vector, steps, adam = flat_state(donor)
    n = donor.num_parameters()
    before = joiner.parameter_vector().clone()
    negative = vector.clone()
    negative[2 * n + 7] = -1.0                      # a negative second moment
    with pytest.raises(ValueError, match="second moments"):
        load_flat_state(joiner, negative, steps, adam)
    with pytest.raises(ValueError, match="past the stage's step count"):
        load_flat_state(joiner, vector, steps, steps + 1)
    with pytest.raises(ValueError, match="without an optimizer step"):
        load_flat_state(joiner, vector, steps, 0)
    assert torch.equal(joiner.parameter_vector(), before)          # nothing half-loaded
