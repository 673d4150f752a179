"""Input files -> a dataset folder: train shards, a validation shard and dataset.json.

Streaming: documents are read in pieces (readers), encoded in batches of about BATCH_BYTES
of text (fastpath) by a few worker processes while earlier batches are written, and written
to shards in input order as they come, hashed on the way. Memory is bounded by a few batches, whatever the
input size. The folder appears atomically: everything is written to a temporary sibling
folder that is renamed into place only once complete.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tokendata.fastpath import FlatEncoder
from tokendata.manifest import MANIFEST, DatasetError, DatasetManifest, TokenizerInfo
from tokendata.readers import Piece, expand_inputs, iter_all
from tokendata.tokenizer import Tokenizer
from tokendata.writer import ShardWriter, Splitter

BATCH_BYTES = 2 << 20
DEFAULT_SHARD_TOKENS = 100_000_000     # 200 MB of uint16 per shard, as FineWeb's nanoGPT shards
DEFAULT_VAL_FRACTION = 0.005


def build_dataset(inputs: Iterable[str | Path], tokenizer: Tokenizer, out_dir: str | Path, *,
                  shard_tokens: int = DEFAULT_SHARD_TOKENS, val_fraction: float = DEFAULT_VAL_FRACTION,
                  val_tokens: int | None = None, val_block: int = 1 << 14, workers: int | None = None,
                  progress: Callable[[int], None] | None = None) -> DatasetManifest:
    """Tokenize `inputs` (.txt files, folders, .jsonl[.gz], .parquet) into `out_dir`, with EOS
    after every document; `progress(bytes_of_text_done)` is called after each batch.
    `workers`: tokenizing processes (None: one per core, or none for a small input)."""
    if shard_tokens < 1:
        raise DatasetError(f"shard size {shard_tokens} must be >= 1 token")
    if not 0 <= val_fraction < 1:
        raise DatasetError(f"validation fraction {val_fraction} must be in [0, 1)")
    if val_tokens is not None and val_tokens < 0:
        raise DatasetError(f"validation tokens {val_tokens} must be >= 0")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out}: already exists and is not an empty folder")
    files = expand_inputs(inputs)
    workers = default_workers(files) if workers is None else workers
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifest = _build_into(files, tokenizer, tmp, shard_tokens, val_fraction, val_tokens,
                               val_block, workers, progress)
        _write_synced(tmp / MANIFEST, manifest.to_json())
        os.chmod(tmp, 0o755)          # mkdtemp's 0700 would hide a shared dataset from others
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _build_into(files: list[Path], tokenizer: Tokenizer, tmp: Path, shard_tokens: int,
                val_fraction: float, val_tokens: int | None, val_block: int, workers: int,
                progress: Callable[[int], None] | None) -> DatasetManifest:
    dtype = tokenizer.token_dtype
    train = ShardWriter(tmp, "train", dtype, shard_tokens)
    val = ShardWriter(tmp, "validation", dtype, None)
    splitter = Splitter(train, val, 0.0 if val_tokens is not None else val_fraction, val_tokens, val_block)
    done = documents = 0
    for ids, nbytes, docs in _encoded_batches(iter_all(files), tokenizer, workers):
        splitter.add(ids)
        done, documents = done + nbytes, documents + docs
        if progress is not None:
            progress(done)
    splitter.finish()
    train_shards, val_shards = train.finish(), val.finish()
    if not train_shards:
        raise DatasetError(f"too little text for a training shard ({splitter.position} tokens, "
                           f"all of them validation)")
    info = TokenizerInfo(tokenizer.name, tokenizer.hash, tokenizer.vocab_size, tokenizer.eos_id)
    return DatasetManifest(info, dtype.name, tuple(train_shards),
                           val_shards[0] if val_shards else None, documents, done)


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += piece.nbytes
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _texts(batch: list[Piece]) -> tuple[list[str], list[bool]]:
    return [p.text for p in batch], [p.doc_end for p in batch]


def _encoded_batches(pieces: Iterator[Piece], tokenizer: Tokenizer,
                     workers: int) -> Iterator[tuple[np.ndarray, int, int]]:
    """(flat ids with EOS after documents, text bytes, documents) per batch, in input order."""
    encoder = FlatEncoder(tokenizer)
    if workers <= 1 or encoder.mode == "byte":       # bytes need no help: numpy is faster than a pipe
        for batch in _batches(pieces):
            yield encoder.encode(*_texts(batch)), sum(p.nbytes for p in batch), sum(p.doc_end for p in batch)
        return
    # Processes, not threads: the word-cache encoder is Python. Spawned, so that no worker
    # inherits tokenizers' thread pool through a fork; each gets the tokenizer as JSON.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(tokenizer.to_json_str(), tokenizer.name)) as pool:
        in_flight: deque = deque()
        for batch in _batches(pieces):
            in_flight.append((pool.submit(_worker_encode, *_texts(batch)),
                              sum(p.nbytes for p in batch), sum(p.doc_end for p in batch)))
            if len(in_flight) >= 2 * workers:            # bounds memory: a few batches at a time
                future, nbytes, docs = in_flight.popleft()
                yield future.result(), nbytes, docs
        while in_flight:
            future, nbytes, docs = in_flight.popleft()
            yield future.result(), nbytes, docs


_worker_encoder: FlatEncoder | None = None


def _init_worker(tokenizer_json: str, name: str) -> None:
    global _worker_encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"       # one thread per worker process
    from tokenizers import Tokenizer as HFTokenizer
    _worker_encoder = FlatEncoder(Tokenizer(HFTokenizer.from_str(tokenizer_json), name))


def _worker_encode(texts: list[str], doc_ends: list[bool]) -> np.ndarray:
    return _worker_encoder.encode(texts, doc_ends)


def default_workers(files: list[Path]) -> int:
    """One per usable core, but none to spawn for a small input."""
    if sum(f.stat().st_size for f in files) < 8 * BATCH_BYTES:
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
