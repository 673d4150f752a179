"""The global sample cursor: every sample once per data epoch, lost ones trained again later."""
import dataclasses

import numpy as np
import pytest

from protocol.schedule import Hop, Route, Schedule, StageAssignment

from coordinator.data_ledger import DataLedger
from tokendata.cursor import (DataCursor, SampleOrder, compress_positions, expand_positions,
                              microbatch_positions, schedule_cursor)


def schedule(microbatches: int, start: int = 0, epoch: int = 1, **data) -> Schedule:
    routes = tuple(Route(mb, (Hop(0, f"o{mb % 2}"), Hop(1, "p"))) for mb in range(microbatches))
    return Schedule(run="t", epoch=epoch, strategy="full", num_stages=2, skip_ratio=0.0,
                    assignment=(StageAssignment("o0", 0), StageAssignment("o1", 0), StageAssignment("p", 1)),
                    routes=routes, start_iteration=start, **data)


def test_iterations_take_consecutive_disjoint_positions_retries_first():
    c = DataCursor(base=100, retry=(7, 3), start_iteration=5, samples_per_iteration=6)
    assert c.positions(5, 0, 3) == [7, 3, 100] and c.positions(5, 1, 3) == [101, 102, 103]
    assert c.positions(6, 0, 3) == [104, 105, 106]
    assert c.at(5) == (100, (7, 3)) and c.at(6) == (104, ()) and c.at(8) == (116, ())
    with pytest.raises(ValueError):
        c.positions(4, 0, 3)


def test_sample_order_visits_every_sample_once_per_epoch_and_reshuffles():
    order = SampleOrder([5, 0, 7, 3], seed=1)
    first = [order.locate(p) for p in range(15)]
    assert sorted(first) == sorted((s, k) for s, n in enumerate([5, 0, 7, 3]) for k in range(n))
    second = [order.locate(p) for p in range(15, 30)]
    assert sorted(second) == sorted(first) and second != first
    # one shard at a time: a volunteer downloads shards as the cursor reaches them
    shards_in_order = [s for s, _ in first]
    assert shards_in_order == sorted(shards_in_order, key=shards_in_order.index)
    with pytest.raises(ValueError):
        SampleOrder([0, 0], seed=1)


def test_every_token_is_a_target_once_per_epoch():
    from peer.samples import SampleSource
    shards = [np.arange(0, 41), np.arange(1000, 1013)]
    source = SampleSource(shards, seq_len=4, seed=3)
    assert source.samples_per_epoch == 10 + 3
    targets = []
    for p in range(source.samples_per_epoch):
        tokens, tgt = source.batch([p])
        assert tokens.shape == (1, 4) and tgt.tolist()[0] == (tokens[0] + 1).tolist()[0:4]
        targets += tgt.flatten().tolist()
    assert sorted(targets) == list(range(1, 41)) + list(range(1001, 1013))


def test_positions_compress_to_ranges():
    pos = [9, 3, 4, 5, 11, 10, 20]
    pairs = compress_positions(pos)
    assert pairs == (3, 3, 9, 3, 20, 1) and expand_positions(pairs) == sorted(pos)
    with pytest.raises(ValueError):
        expand_positions((1, 2, 3))


def test_lost_microbatches_are_trained_once_in_a_later_epoch():
    samples = 2
    ledger = DataLedger(samples)
    s1 = schedule(4, start=0, **ledger.fields_for([], 0))
    trained = []
    lost_iteration, lost_ids = 1, [1, 3]
    for i in range(3):
        for mb in range(4):
            pos = microbatch_positions(s1, samples, i, mb)
            if i == lost_iteration and mb in lost_ids:
                continue
            trained += pos
    ledger.lost(s1, lost_iteration, lost_ids)
    assert ledger.has_pending()
    s2 = dataclasses.replace(s1, epoch=2, start_iteration=3, **ledger.fields_for([s1], 3))
    assert not ledger.has_pending() and s2.data_base == 24 and len(s2.data_retry) == 4
    for i in range(3, 5):
        for mb in range(4):
            trained += microbatch_positions(s2, samples, i, mb)
    assert len(trained) == len(set(trained)), "a sample was trained twice"
    fresh, left = schedule_cursor(s2, samples).at(5)
    assert left == () and sorted(trained) == list(range(fresh))


def test_a_replan_that_starts_before_a_republish_keeps_its_retries_and_skips_nothing():
    """A republish carrying retries (epoch 2, from iteration 6) is overtaken by a re-plan that
    starts earlier (epoch 3, from iteration 4): epoch 2 never runs, epoch 1 runs iterations 0-3,
    and epoch 3 must go on from where epoch 1 stopped, with epoch 2's retries."""
    samples = 2
    ledger = DataLedger(samples)
    s1 = schedule(2, start=0, **ledger.fields_for([], 0))
    trained = [p for i in range(4) for mb in range(2) for p in microbatch_positions(s1, samples, i, mb)
               if (i, mb) != (1, 1)]
    ledger.lost(s1, 1, [1])
    s2 = dataclasses.replace(s1, epoch=2, start_iteration=6, **ledger.fields_for([s1], 6))
    s3 = dataclasses.replace(s1, epoch=3, start_iteration=4, **ledger.fields_for([s1, s2], 4))
    assert s3.data_base == 4 * 2 * samples and set(s3.data_retry) == set(s2.data_retry) == {6, 7}
    trained += [p for i in range(4, 8) for mb in range(2) for p in microbatch_positions(s3, samples, i, mb)]
    assert len(trained) == len(set(trained)) and sorted(trained) == list(range(len(trained)))
    # a later schedule from iteration 5 goes on from epoch 3 (which carried epoch 2's retries: not again)
    s4 = dataclasses.replace(s1, epoch=4, start_iteration=5, **ledger.fields_for([s1, s2, s3], 5))
    assert s4.data_retry == () and s4.data_base == schedule_cursor(s3, samples).at(5)[0]


def test_a_schedule_refuses_negative_or_repeated_retry_positions():
    from protocol.errors import FieldError
    with pytest.raises(FieldError):
        schedule(2, data_retry=(1, 1))
    with pytest.raises(FieldError):
        schedule(2, data_base=-1)
