"""Tokenizer and dataset subcommands: `tokenizer` and `data` (wired into coordinator/cli.py).

    skippipe-coordinator tokenizer --input corpus/ --vocab-size 8192 -o tokenizer.json
    skippipe-coordinator data --input corpus/ more.jsonl.gz --tokenizer tokenizer.json -o dataset/

Both stream their inputs (.txt files and folders, .jsonl / .jsonl.gz with a `text` field,
.parquet with a `text` column) with progress on stderr; torch-free, like the coordinator.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from swarmcore.cli.support import fail_usage, positive_int

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


def _terminate_as_interrupt() -> None:
    """SIGTERM cleans up like Ctrl-C: the half-written temporary folder is removed."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def cmd_tokenizer(args) -> int:
    from tokendata.readers import InputError, expand_inputs
    from tokendata.progress import Progress
    from tokendata.tokenizer import TokenizerError, train_bpe
    out = Path(args.output)
    if not out.parent.is_dir():
        return fail_usage(PROG, f"cannot write {out}: folder {out.parent} does not exist")
    start = time.monotonic()
    report = Progress("tokenizer: read")
    try:
        expand_inputs(args.input)        # bad paths fail before any work
        tok = train_bpe(args.input, args.vocab_size, progress=report)
        report.close()
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tok.save(tmp)
        tmp.replace(out)
    except (InputError, TokenizerError) as exc:
        report.close(final=False)
        return fail_usage(PROG, str(exc))
    except OSError as exc:
        return fail_usage(PROG, f"cannot write {out}: {exc.strerror}")
    except KeyboardInterrupt:
        report.close(final=False)
        return 130
    print(f"{out}: byte-level BPE, vocab {tok.vocab_size}, eos {tok.eos_id}, hash {tok.hash[:16]} "
          f"({time.monotonic() - start:.1f} s)")
    return 0


def cmd_data(args) -> int:
    from tokendata.build import build_dataset
    from tokendata.manifest import DatasetError
    from tokendata.readers import InputError
    from tokendata.progress import Progress
    from tokendata.tokenizer import TokenizerError, load_tokenizer
    start = time.monotonic()
    report = Progress("data: tokenizing")
    _terminate_as_interrupt()
    try:
        tok = load_tokenizer(args.tokenizer)
        report.label = f"data: tokenizing with {tok.name}"
        m = build_dataset(args.input, tok, args.output, shard_tokens=args.shard_tokens,
                          val_fraction=args.val_fraction, val_tokens=args.val_tokens,
                          workers=args.workers, progress=report)
    except (InputError, TokenizerError, DatasetError) as exc:
        report.close(final=False)
        return fail_usage(PROG, str(exc))
    except OSError as exc:
        report.close(final=False)
        return fail_usage(PROG, f"cannot write {args.output}: {exc.strerror}")
    except KeyboardInterrupt:
        report.close(final=False)
        return 130
    elapsed = time.monotonic() - start
    report(m.source_bytes)
    report.close()
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
    d.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="tokenizing processes (default: one per CPU core for inputs over a few MB)")
    d.set_defaults(func=cmd_data)
