"""Held-out perplexity with stages omitted (peer/evaluate.py, `skippipe-coordinator eval`)."""
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from protocol import messages as m

from peer.compute.model import get_config
from peer.compute.runner import StageRunner
from peer.compute.stages import reference_forward
from peer.evaluate import EvalError, evaluate, load_stages, main, perplexity
from peer.pipeline.checkpoint import CheckpointStore

SPEC = m.RunSpec(run="ev", model="tiny", num_stages=5, skip_ratio=0.5, seed=7)


@pytest.fixture
def checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, "ev")
    for stage in range(SPEC.num_stages):
        store.save(StageRunner.from_spec(SPEC, stage), stage, 3)
    return tmp_path


def batches(n=2):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        t = torch.randint(0, 256, (2, 17), generator=g)
        out.append((t[:, :-1], t[:, 1:]))
    return out


def test_all_stages_match_the_single_process_model_and_omission_uses_the_given_order(checkpoint):
    run, stages = load_stages(checkpoint, None)
    assert run == "ev" and len(stages) == 5
    data = batches()
    cfg = get_config("tiny")
    for order in [(0, 1, 2, 3, 4), (0, 2, 4)]:
        expect = [float(reference_forward(cfg, SPEC.seed, x, y, order, 5)) for x, y in data]
        assert perplexity(stages, order, data) == pytest.approx(math.exp(sum(expect) / len(expect)), rel=1e-5)


def test_half_omitted_tries_every_choice_and_reports_the_worst(checkpoint):
    _, stages = load_stages(checkpoint, None)
    r = evaluate(stages, 0.5, batches())
    assert r["omitted"] == 2 and r["choices"] == 6                # C(4, 2)
    assert r["ppl_worst"] >= r["ppl_random_mean"] > 0
    assert 0 not in r["worst_omitted"] and len(r["worst_omitted"]) == 2
    none = evaluate(stages, 0.0, batches())
    assert none["omitted"] == 0 and none["ppl_random_mean"] == pytest.approx(none["ppl_all"])


def test_unusable_checkpoints_are_clear_errors(tmp_path, checkpoint, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EvalError, match="no stage checkpoints"):
        load_stages(empty, None)
    weights = checkpoint / "ev-stage2" / "it00000003" / "model.safetensors"
    weights.write_bytes(b"not a checkpoint")
    with pytest.raises(EvalError, match="not a readable safetensors"):
        load_stages(checkpoint, None)
    shutil.rmtree(checkpoint / "ev-stage2")
    with pytest.raises(EvalError, match=r"lacks stage\(s\) 2 "):
        load_stages(checkpoint, None)
    shutil.rmtree(checkpoint / "ev-stage3")
    shutil.rmtree(checkpoint / "ev-stage4")
    with pytest.raises(EvalError, match="lacks its last stage"):
        load_stages(checkpoint, None)
    assert main(["--checkpoint", str(checkpoint / "missing")]) == 2
    assert main(["--checkpoint", str(checkpoint), "--omit", "1.5"]) == 2
    assert "error" in capsys.readouterr().err


def test_coordinator_eval_subcommand_relays_result_and_exit_code(checkpoint):
    ok = subprocess.run([sys.executable, "-m", "coordinator.cli", "eval", "--checkpoint", str(checkpoint),
                         "--omit", "0.5", "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["run"] == "ev" and result["omitted"] == 2 and result["ppl_all"] > 1
    bad = subprocess.run([sys.executable, "-m", "coordinator.cli", "eval", "--checkpoint", str(checkpoint / "no")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not a folder" in bad.stderr


def test_first_format_pt_checkpoints_still_load(tmp_path):
    """One <run>-stage<K>.pt per stage (before safetensors): evaluation and resume read it."""
    runners = [StageRunner.from_spec(SPEC, s) for s in range(SPEC.num_stages)]
    for s, r in enumerate(runners):
        torch.save({"iteration": 5, "runner": r.state_dict()}, tmp_path / f"ev-stage{s}.pt")
    run, stages = load_stages(tmp_path, None)
    assert run == "ev" and [st.layer_start for st in stages] == [r.module.layer_start for r in runners]
    fresh = StageRunner.from_spec(m.RunSpec(run="ev", model="tiny", num_stages=5, skip_ratio=0.5, seed=99), 1)
    assert CheckpointStore(tmp_path, "ev").load(fresh, 1) == 5
    assert torch.equal(fresh.parameter_vector(), runners[1].parameter_vector())

def test_a_junk_pt_checkpoint_is_one_clear_line(tmp_path):
    (tmp_path / "ev-stage0.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(EvalError, match=r"ev-stage0.pt is not a stage checkpoint \(torch cannot read it"):
        load_stages(tmp_path, None)
