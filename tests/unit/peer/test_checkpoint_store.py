"""Checkpoints: safetensors weights + optimizer apart, written by a background thread from a
snapshot, --save-every / --keep-last, atomic versions, resume from the newest usable one."""
import json

import torch
from safetensors import safe_open

from protocol import messages as m

from peer.compute import stage_checkpoint as sc
from peer.compute.runner import StageRunner
from peer.pipeline.checkpoint import CheckpointStore

SPEC = m.RunSpec(run="ck", model="tiny", num_stages=2, skip_ratio=0.0, seed=3)


def trained_runner(stage=1, steps=1):
    r = StageRunner.from_spec(SPEC, stage)
    for _ in range(steps):
        for p in r.module.parameters():
            p.grad = torch.ones_like(p)
        r.samples_this_step = 1
        r.step()
    return r


def test_versions_are_safetensors_plus_optimizer_and_resume_restores_both(tmp_path):
    runner = trained_runner()
    path = CheckpointStore(tmp_path, "ck").save(runner, 1, 7)
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "optimizer.pt"]
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
    assert meta["iteration"] == "7" and meta["stage"] == "1"
    assert json.loads(meta["model_config"])["hidden_size"] == 64
    start = runner.module.layer_start
    assert f"layers.{start}.attn.wq.weight" in names        # global layer names, as export wants
    fresh = StageRunner.from_spec(SPEC, 1)
    assert CheckpointStore(tmp_path, "ck").load(fresh, 1) == 7
    assert torch.equal(fresh.parameter_vector(), runner.parameter_vector())
    assert fresh.step_count == runner.step_count
    a = runner.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["exp_avg"], a)


def test_the_snapshot_is_taken_before_training_goes_on(tmp_path):
    store = CheckpointStore(tmp_path, "ck")
    runner = trained_runner()
    before = runner.parameter_vector().clone()
    store.snapshot(runner, 1, 0)
    with torch.no_grad():                       # training changes the weights meanwhile
        for p in runner.module.parameters():
            p.add_(1.0)
    assert store.flush(timeout_s=30)
    fresh = StageRunner.from_spec(SPEC, 1)
    store.load(fresh, 1)
    assert torch.equal(fresh.parameter_vector(), before)


def test_save_every_and_keep_last(tmp_path):
    store = CheckpointStore(tmp_path, "ck", save_every=3, keep_last=2)
    assert [i for i in range(10) if store.due(i, max_steps=10)] == [2, 5, 8, 9]
    runner = trained_runner()
    for i in (2, 5, 8, 9):
        store.save(runner, 1, i)
    assert [f.iteration for f in sc.versions(tmp_path, "ck", 1)] == [8, 9]


def test_a_damaged_newest_version_falls_back_to_the_older_one(tmp_path):
    store = CheckpointStore(tmp_path, "ck", keep_last=3)
    runner = trained_runner()
    store.save(runner, 1, 4)
    (store.save(runner, 1, 5) / "model.safetensors").write_bytes(b"\0" * 10)
    assert store.load(StageRunner.from_spec(SPEC, 1), 1) == 4


def test_a_replica_saving_the_same_version_is_harmless(tmp_path):
    runner = trained_runner()
    first = sc.write_version(tmp_path, "ck", runner.config, runner.state_dict(), 2)
    second = sc.write_version(tmp_path, "ck", runner.config, runner.state_dict(), 2)
    assert first is not None and second is None
    assert [p.name for p in first.parent.iterdir()] == ["it00000002"]      # no temp folder left


def test_the_checkpoint_records_the_run_s_tokenizer_and_export_defaults_to_it(tmp_path):
    import pytest

    from peer.hf_cli import UsageError, export_tokenizer
    from tokendata.tokenizer import load_tokenizer
    bpe = load_tokenizer("bpe")
    store = CheckpointStore(tmp_path, "ck", tokenizer=("bpe", bpe.hash))
    store.save(trained_runner(stage=0), 0, 3)
    store.save(trained_runner(stage=1), 1, 3)
    recorded = sc.recorded_tokenizer(tmp_path, "ck")
    assert recorded == ("bpe", bpe.hash)
    assert export_tokenizer(None, recorded).hash == bpe.hash
    with pytest.raises(UsageError, match="not the tokenizer the run trained with"):
        export_tokenizer("byte", recorded)
    with pytest.raises(UsageError, match="pass that tokenizer.json"):
        export_tokenizer(None, ("my-tokenizer.json", "ab" * 32))
    assert export_tokenizer(None, None).name == "byte"      # checkpoints from before the record
