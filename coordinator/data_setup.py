"""What the run spec says about the run's data, from the coordinator's --data and --tokenizer.

Checked before any network starts, so that a bad folder is one line and exit code 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokendata.manifest import DatasetError, DatasetManifest, MANIFEST, verify_dataset
from tokendata.tokenizer import TokenizerError, load_tokenizer

CORPUS_TOKENIZERS = ("byte", "bpe")   # what a peer can rebuild the embedded corpus with


class DataSetupError(ValueError):
    """--data or --tokenizer is unusable (one line)."""


@dataclass(frozen=True)
class RunData:
    tokenizer: str
    tokenizer_hash: str
    vocab_size: int                 # tokens the tokenizer emits (the model pads it up)
    dataset_id: str = ""
    folder: Path | None = None
    manifest: DatasetManifest | None = None


def resolve_run_data(data_dir: str, tokenizer: str | None) -> RunData:
    """--data DIR (a dataset folder, its hashes checked) or the embedded corpus with --tokenizer
    (default: byte). With --data, a --tokenizer must be the dataset's own."""
    if data_dir:
        try:
            manifest = verify_dataset(data_dir)
        except DatasetError as exc:
            raise DataSetupError(f"--data: {exc}") from None
        t = manifest.tokenizer
        if tokenizer:
            try:
                named = load_tokenizer(tokenizer)
            except TokenizerError as exc:
                raise DataSetupError(f"--tokenizer: {exc}") from None
            if named.hash != t.hash:
                raise DataSetupError(f"--tokenizer {tokenizer} is not the tokenizer the dataset in {data_dir} was "
                                     f"made with ({t.name}); leave --tokenizer out to use the dataset's")
        return RunData(Path(t.name).name, t.hash, t.vocab_size, manifest.dataset_id, Path(data_dir), manifest)
    tokenizer = tokenizer or "byte"
    if tokenizer not in CORPUS_TOKENIZERS:
        raise DataSetupError(f"--tokenizer {tokenizer}: without --data the run trains on the embedded corpus, "
                             f"which peers tokenise themselves with {' or '.join(CORPUS_TOKENIZERS)}; "
                             f"build a dataset with it instead (skippipe-coordinator data --tokenizer FILE)")
    try:
        tok = load_tokenizer(tokenizer)
    except TokenizerError as exc:
        raise DataSetupError(str(exc)) from None
    return RunData(tokenizer, tok.hash, tok.vocab_size)


def servable_files(run_data: RunData) -> dict[str, Path]:
    """What the coordinator serves to volunteers: the manifest and its shards."""
    if run_data.folder is None or run_data.manifest is None:
        return {}
    files = {MANIFEST: run_data.folder / MANIFEST}
    files.update({s.file: run_data.folder / s.file for s in run_data.manifest.shards})
    return files
