"""Stream documents out of input files, with memory bounded by the piece size.

A piece is part (or all) of one document: `(text, doc_end, nbytes)`. A .txt file is one
document, cut into pieces of about PIECE_BYTES at line ends so that a 10 GB file never sits
in memory whole; a .jsonl line and a parquet row are one document each.
"""
from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

PIECE_BYTES = 1 << 20
PARQUET_BATCH_ROWS = 1024
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")


class InputError(ValueError):
    """An input file is missing, empty, unreadable or corrupt (message names the file)."""


class Piece(NamedTuple):
    text: str
    doc_end: bool        # the document ends after this piece (EOS goes here)
    nbytes: int          # UTF-8 bytes of text, for progress


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files as given (any supported suffix) and folders searched recursively, in name order."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _kind(f))
            if not found:
                raise InputError(f"{p}: folder has no {'/'.join(SUFFIXES)} files")
            files += found
        elif p.is_file():
            if not _kind(p):
                raise InputError(f"{p}: unsupported input type (use {', '.join(SUFFIXES)})")
            files.append(p)
        else:
            raise InputError(f"{p}: no such file or folder")
    if not files:
        raise InputError("no input files given")
    for f in files:            # cheap early check; emptiness after decoding is caught in iter_pieces
        if f.stat().st_size == 0:
            raise InputError(f"{f}: empty file")
    return files


def _kind(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in (".jsonl.gz",) + SUFFIXES if name.endswith(s)), "")


def iter_pieces(path: Path) -> Iterator[Piece]:
    """The pieces of one file; raises InputError naming the file if it is empty or corrupt."""
    kind = _kind(path)
    reader = {".txt": _txt, ".jsonl": _jsonl, ".jsonl.gz": _jsonl, ".parquet": _parquet}[kind]
    any_text = False
    try:
        for piece in reader(path):
            any_text = any_text or bool(piece.text.strip())
            yield piece
    except InputError:
        raise
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except Exception as exc:  # pyarrow's errors have no common base we can import lazily
        raise InputError(f"{path}: corrupt {kind} file: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if not any_text:
        raise InputError(f"{path}: empty (no text)")


def iter_all(paths: Iterable[Path]) -> Iterator[Piece]:
    for p in paths:
        yield from iter_pieces(p)


def _txt(path: Path) -> Iterator[Piece]:
    with open(path, "rb") as f:
        carry = b""
        while True:
            block = f.read(PIECE_BYTES)
            if not block:
                break
            data = carry + block
            cut = data.rfind(b"\n") + 1      # whole lines only; a line never spans pieces
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            yield Piece(data[:cut].decode("utf-8"), False, cut)
        yield Piece(carry.decode("utf-8"), True, len(carry))


def _jsonl(path: Path) -> Iterator[Piece]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise InputError(f"{path}: line {number} is not valid JSON") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{path}: line {number} has no string 'text' field")
            yield Piece(text, True, len(line))


def _parquet(path: Path) -> Iterator[Piece]:
    import pyarrow.parquet as pq  # only when a parquet input is given
    pf = pq.ParquetFile(path)
    if "text" not in pf.schema_arrow.names:
        raise InputError(f"{path}: no 'text' column (columns: {', '.join(pf.schema_arrow.names)})")
    import pyarrow as pa
    import pyarrow.compute as pc
    kind = pf.schema_arrow.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{path}: 'text' column is {kind}, not a string column")
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=["text"]):
        column = batch.column(0)
        for text, nbytes in zip(column.to_pylist(), pc.binary_length(column).to_pylist()):
            if text is not None:
                yield Piece(text, True, nbytes)
