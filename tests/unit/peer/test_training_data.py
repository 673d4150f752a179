"""A stage-0 peer trains only on the run's data: the spec's dataset and tokenizer, checked."""
import dataclasses

import numpy as np
import pytest

from protocol.messages import RunSpec

from peer.training_data import DataMismatch, corpus_samples, dataset_samples
from tokendata.build import build_dataset
from tokendata.tokenizer import load_tokenizer

SPEC = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, seq_len=16)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ds")
    (folder / "in.txt").write_text("to be or not to be, that is the question. " * 400)
    out = folder / "dataset"
    manifest = build_dataset([folder / "in.txt"], load_tokenizer("byte"), out)
    return out, manifest


def test_the_run_s_dataset_trains(dataset):
    folder, manifest = dataset
    spec = dataclasses.replace(SPEC, dataset_id=manifest.dataset_id, tokenizer_hash=manifest.tokenizer.hash)
    source = dataset_samples(spec, folder)
    tokens, targets = source.batch([0, 1, source.samples_per_epoch - 1])
    assert tokens.shape == (3, 16) and int(tokens.max()) < 257
    assert bytes(tokens[0].tolist()).decode("utf-8", errors="replace").strip()


def test_another_dataset_or_tokenizer_is_refused(dataset):
    folder, manifest = dataset
    with pytest.raises(DataMismatch, match="expects"):
        dataset_samples(dataclasses.replace(SPEC, dataset_id="0123456789abcdef"), folder)
    with pytest.raises(DataMismatch, match="tokenizer"):
        dataset_samples(dataclasses.replace(SPEC, dataset_id=manifest.dataset_id, tokenizer_hash="f" * 64), folder)
    shard = folder / manifest.train[0].file
    original = shard.read_bytes()
    try:
        shard.write_bytes(b"\0" * len(original))           # same size, other tokens
        with pytest.raises(DataMismatch, match="sha256"):
            dataset_samples(dataclasses.replace(SPEC, dataset_id=manifest.dataset_id), folder)
    finally:
        shard.write_bytes(original)


def test_the_embedded_corpus_with_the_run_s_tokenizer():
    byte = corpus_samples(SPEC, None)
    bpe_spec = dataclasses.replace(SPEC, tokenizer="bpe", tokenizer_hash=load_tokenizer("bpe").hash)
    bpe = corpus_samples(bpe_spec, None)
    assert bpe.samples_per_epoch < byte.samples_per_epoch        # fewer, longer tokens
    assert int(bpe.batch([5])[0].max()) < 4096
    with pytest.raises(DataMismatch, match="not the run's"):
        corpus_samples(dataclasses.replace(bpe_spec, tokenizer_hash="0" * 64), None)
    with pytest.raises(DataMismatch, match="not a dataset folder"):
        corpus_samples(dataclasses.replace(SPEC, dataset_id="0123456789abcdef"), None)


def test_a_dataset_folder_for_a_corpus_run_is_refused(dataset):
    with pytest.raises(DataMismatch, match="trains on the embedded corpus"):
        corpus_samples(SPEC, dataset[0])
