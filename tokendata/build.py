"""Input files -> a dataset folder: train shards, a validation shard and dataset.json.

Streaming: documents are read in pieces (readers), encoded in batches of about BATCH_BYTES
of text on tokenizers' thread pool while the previous batch is being written, and written
to shards as they come, hashed on the way. Memory is bounded by a few batches, whatever the
input size. The folder appears atomically: everything is written to a temporary sibling
folder that is renamed into place only once complete.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tokendata.manifest import MANIFEST, DatasetError, DatasetManifest, TokenizerInfo
from tokendata.readers import Piece, expand_inputs, iter_all
from tokendata.tokenizer import Tokenizer
from tokendata.writer import ShardWriter, Splitter

BATCH_BYTES = 4 << 20
DEFAULT_SHARD_TOKENS = 100_000_000     # 200 MB of uint16 per shard, as FineWeb's nanoGPT shards
DEFAULT_VAL_FRACTION = 0.005


def build_dataset(inputs: Iterable[str | Path], tokenizer: Tokenizer, out_dir: str | Path, *,
                  shard_tokens: int = DEFAULT_SHARD_TOKENS, val_fraction: float = DEFAULT_VAL_FRACTION,
                  val_tokens: int | None = None, val_block: int = 1 << 14,
                  progress: Callable[[int], None] | None = None) -> DatasetManifest:
    """Tokenize `inputs` (.txt files, folders, .jsonl[.gz], .parquet) into `out_dir`, with EOS
    after every document; `progress(bytes_of_text_done)` is called after each batch."""
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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifest = _build_into(files, tokenizer, tmp, shard_tokens, val_fraction, val_tokens,
                               val_block, progress)
        (tmp / MANIFEST).write_text(manifest.to_json())
        os.chmod(tmp, 0o755)          # mkdtemp's 0700 would hide a shared dataset from others
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _build_into(files: list[Path], tokenizer: Tokenizer, tmp: Path, shard_tokens: int,
                val_fraction: float, val_tokens: int | None, val_block: int,
                progress: Callable[[int], None] | None) -> DatasetManifest:
    dtype = tokenizer.token_dtype
    train = ShardWriter(tmp, "train", dtype, shard_tokens)
    val = ShardWriter(tmp, "validation", dtype, None)
    splitter = Splitter(train, val, 0.0 if val_tokens is not None else val_fraction, val_tokens, val_block)
    done = documents = 0
    for ids, nbytes, docs in _encoded_batches(iter_all(files), tokenizer):
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


def _encode(tokenizer: Tokenizer, batch: list[Piece]) -> tuple[np.ndarray, int, int]:
    """One flat array for the batch, EOS after every piece that ends a document."""
    encoded = tokenizer.encode_batch([p.text for p in batch])
    eos = [tokenizer.eos_id]
    chunks = (ids + eos if p.doc_end else ids for ids, p in zip(encoded, batch))
    total = sum(len(ids) + p.doc_end for ids, p in zip(encoded, batch))
    flat = np.fromiter(itertools.chain.from_iterable(chunks), dtype=tokenizer.token_dtype, count=total)
    return flat, sum(p.nbytes for p in batch), sum(p.doc_end for p in batch)


def _encoded_batches(pieces: Iterator[Piece], tokenizer: Tokenizer) -> Iterator[tuple[np.ndarray, int, int]]:
    """Encode batch k+1 (tokenizers releases the GIL) while the caller writes batch k."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as pool:
        pending = None
        for batch in _batches(pieces):
            future = pool.submit(_encode, tokenizer, batch)
            if pending is not None:
                yield pending.result()
            pending = future
        if pending is not None:
            yield pending.result()
