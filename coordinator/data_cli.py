"""Tokenizer and dataset subcommands: `tokenizer` and `data` (wired into coordinator/cli.py).

    skippipe-coordinator tokenizer --input corpus/ --vocab-size 8192 -o tokenizer.json
    skippipe-coordinator data --input corpus/ more.jsonl.gz --tokenizer tokenizer.json -o dataset/

Both stream their inputs (.txt files and folders, .jsonl / .jsonl.gz with a `text` field,
.parquet with a `text` column) with progress on stderr; torch-free, like the coordinator.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from protocol.cli_support import fail_usage, positive_int

PROG = "skippipe-coordinator"


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _vocab(text: str) -> int:
    value = positive_int(text)
    if not 257 <= value <= 1 << 32:
        raise argparse.ArgumentTypeError(f"must be in [257, 2^32] (256 bytes + <|endoftext|>), got {value}")
    return value


def cmd_tokenizer(args) -> int:
    from tokendata.readers import InputError, expand_inputs
    from tokendata.tokenizer import TokenizerError, stderr_progress, train_bpe
    out = Path(args.output)
    if not out.parent.is_dir():
        return fail_usage(PROG, f"cannot write {out}: folder {out.parent} does not exist")
    start = time.monotonic()
    try:
        expand_inputs(args.input)        # bad paths fail before any work
        report = stderr_progress("tokenizer: read")
        tok = train_bpe(args.input, args.vocab_size, progress=report)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tok.save(tmp)
        tmp.replace(out)
    except (InputError, TokenizerError) as exc:
        return fail_usage(PROG, str(exc))
    except OSError as exc:
        return fail_usage(PROG, f"cannot write {out}: {exc.strerror}")
    except KeyboardInterrupt:
        return 130
    print(f"{out}: byte-level BPE, vocab {tok.vocab_size}, eos {tok.eos_id}, hash {tok.hash[:16]} "
          f"({time.monotonic() - start:.1f} s)")
    return 0


def cmd_data(args) -> int:
    from tokendata.build import build_dataset
    from tokendata.manifest import DatasetError
    from tokendata.readers import InputError
    from tokendata.tokenizer import TokenizerError, load_tokenizer, stderr_progress
    start = time.monotonic()
    try:
        tok = load_tokenizer(args.tokenizer)
        report = stderr_progress(f"data: tokenizing with {tok.name}")
        m = build_dataset(args.input, tok, args.output, shard_tokens=args.shard_tokens,
                          val_fraction=args.val_fraction, val_tokens=args.val_tokens, progress=report)
    except (InputError, TokenizerError, DatasetError) as exc:
        return fail_usage(PROG, str(exc))
    except OSError as exc:
        return fail_usage(PROG, f"cannot write {args.output}: {exc.strerror}")
    except KeyboardInterrupt:
        return 130
    elapsed = time.monotonic() - start
    report(m.source_bytes, final=True)
    print(f"{args.output}: dataset {m.dataset_id}, {m.documents:,} documents, {m.train_tokens:,} train "
          f"tokens in {len(m.train)} shard(s), {m.validation_tokens:,} validation tokens, {m.dtype}, "
          f"{m.source_bytes / 1e6:,.1f} MB of text in {elapsed:.1f} s "
          f"({m.source_bytes / 1e6 / max(elapsed, 1e-9):.1f} MB/s)")
    return 0


def register(subparsers) -> None:
    """Add the `tokenizer` and `data` subcommands to an argparse subparsers object."""
    t = subparsers.add_parser("tokenizer", help="train a byte-level BPE tokenizer (tokenizer.json)",
                              description="Train a byte-level BPE tokenizer with <|endoftext|> on text "
                                          "inputs, streaming them; write a Hugging Face tokenizer.json.")
    t.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help=".txt files or folders, .jsonl / .jsonl.gz (text field), .parquet (text column)")
    t.add_argument("--vocab-size", type=_vocab, required=True, metavar="N", help="tokens, incl. 256 bytes + EOS")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="tokenizer.json to write")
    t.set_defaults(func=cmd_tokenizer)

    d = subparsers.add_parser("data", help="tokenize text into a dataset folder (shards + dataset.json)",
                              description="Tokenize inputs into flat token shards (uint16/uint32), a held-out "
                                          "validation shard and a dataset.json manifest with hashes.")
    d.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help=".txt files or folders, .jsonl / .jsonl.gz (text field), .parquet (text column)")
    d.add_argument("--tokenizer", default="bpe", metavar="byte|bpe|FILE",
                   help="byte, bpe (the shipped one; default) or a tokenizer.json")
    d.add_argument("-o", "--output", required=True, metavar="DIR", help="dataset folder to create (new or empty)")
    d.add_argument("--shard-tokens", type=positive_int, default=100_000_000, metavar="N",
                   help="tokens per train shard (default: 100000000)")
    val = d.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=_fraction, default=0.005, metavar="F",
                     help="fraction held out for validation, spread over the input (default: 0.005)")
    val.add_argument("--val-tokens", type=positive_int, default=None, metavar="N",
                     help="instead: the first N tokens are the validation shard")
    d.set_defaults(func=cmd_data)
