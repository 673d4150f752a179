"""The tokens a stage-0 peer trains on, checked against what the run spec names.

    spec.dataset_id == ""   the embedded corpus (or --data FILE|FOLDER of .txt, the old way),
                            tokenised in memory with the spec's tokenizer; the first 95% trains
    spec.dataset_id != ""   a dataset folder (tokendata): --data DIR, verified against the spec,
                            or the copy downloaded into --cache-dir (peer/dataset_fetch.py)
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from protocol.messages import RunSpec

from peer.data import DEFAULT_HELD_OUT, CorpusError, load_corpus
from peer.samples import SampleSource

logger = logging.getLogger(__name__)
MANIFEST = "dataset.json"


class DataMismatch(Exception):
    """This peer's data is not the run's: one line that says which and what to do."""


def is_dataset_folder(path: Path | None) -> bool:
    return path is not None and (Path(path) / MANIFEST).is_file()


def corpus_samples(spec: RunSpec, path: Path | None) -> SampleSource:
    from tokendata.tokenizer import TokenizerError, load_tokenizer
    if spec.dataset_id:
        raise DataMismatch(f"run {spec.run!r} trains on dataset {spec.dataset_id}; --data {path} is not a "
                           f"dataset folder (make one with `skippipe-coordinator data`, or leave --data out "
                           f"to download the run's)")
    if is_dataset_folder(path):
        raise DataMismatch(f"--data {path} is a dataset folder, but run {spec.run!r} trains on the embedded "
                           f"corpus (its coordinator has no --data); leave --data out")
    try:
        text = load_corpus(path)
    except CorpusError as exc:
        raise DataMismatch(str(exc)) from None
    if spec.tokenizer == "byte":
        tokens = np.frombuffer(text, dtype=np.uint8)
    else:
        try:
            tokenizer = load_tokenizer(spec.tokenizer)
        except TokenizerError as exc:
            raise DataMismatch(f"cannot load the run's tokenizer: {exc}") from None
        if spec.tokenizer_hash and tokenizer.hash != spec.tokenizer_hash:
            raise DataMismatch(f"our tokenizer {spec.tokenizer!r} (hash {tokenizer.hash[:12]}) is not the run's "
                               f"(hash {spec.tokenizer_hash[:12]}); upgrade skippipe-swarm")
        tokens = np.asarray(tokenizer.encode(text.decode("utf-8", errors="replace")), dtype=tokenizer.token_dtype)
    cut = len(tokens) - int(len(tokens) * DEFAULT_HELD_OUT)
    return SampleSource([tokens[:cut]], spec.seq_len, spec.seed)


def dataset_samples(spec: RunSpec, folder: Path, check_hashes: bool = True) -> SampleSource:
    """The training shards of a verified dataset folder, as memmaps."""
    from tokendata.manifest import DatasetError, verify_dataset
    try:
        manifest = verify_dataset(folder, expected_dataset_id=spec.dataset_id or None,
                                  expected_tokenizer_hash=spec.tokenizer_hash or None, check_hashes=check_hashes)
    except DatasetError as exc:
        raise DataMismatch(str(exc)) from None
    shards = [np.memmap(Path(folder) / s.file, dtype=manifest.dtype, mode="r") for s in manifest.train]
    logger.info("training data: dataset %s (%d shards, %d tokens, tokenizer %s)", manifest.dataset_id,
                len(shards), sum(len(s) for s in shards), manifest.tokenizer.name)
    return SampleSource(shards, spec.seq_len, spec.seed)
