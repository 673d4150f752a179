"""A coordinator that starts afresh continues the sample cursor of the newest stage-0 checkpoint."""
import json


from protocol import messages as m

from coordinator.data_ledger import DataLedger
from coordinator.data_resume import saved_cursor
from peer.compute.runner import StageRunner
from peer.pipeline.checkpoint import CheckpointStore

SPEC = m.RunSpec(run="rs", model="tiny", num_stages=2, skip_ratio=0.0, seed=1)


def test_stage0_checkpoints_carry_the_cursor_and_a_fresh_coordinator_continues_it(tmp_path):
    store = CheckpointStore(tmp_path, "rs", keep_last=3)
    runner = StageRunner.from_spec(SPEC, 0)
    for it, base in ((4, 80), (9, 180)):
        store.snapshot(runner, 0, it, {"iteration": it + 1, "base": base, "retry": [3, 7], "dataset_id": "ds1"})
        assert store.flush(timeout_s=30)
    cursor = saved_cursor(tmp_path, "rs", "ds1")
    assert (cursor.iteration, cursor.base, cursor.retry) == (10, 180, (3, 7))
    assert saved_cursor(tmp_path, "rs", "other") is None            # saved for another dataset
    assert saved_cursor(tmp_path, "nope", "ds1") is None
    ledger = DataLedger(4)
    ledger.resumed = (cursor.base, cursor.retry)
    assert ledger.fields_for([], cursor.iteration) == {"data_base": 180, "data_retry": (3, 7)}


def test_a_damaged_cursor_file_is_ignored(tmp_path):
    store = CheckpointStore(tmp_path, "rs")
    store.save(StageRunner.from_spec(SPEC, 0), 0, 2)
    folder = next((tmp_path / "rs-stage0").glob("it*"))
    (folder / "data_cursor.json").write_text("{not json")
    assert saved_cursor(tmp_path, "rs", "") is None
    (folder / "data_cursor.json").write_text(json.dumps({"iteration": 3, "base": -5, "retry": []}))
    assert saved_cursor(tmp_path, "rs", "") is None
