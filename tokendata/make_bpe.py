"""Regenerate the shipped BPE tokenizer, tokendata/assets/bpe.json, from the embedded corpus:

    python -m tokendata.make_bpe [--vocab-size 4096]

Training is deterministic for a given `tokenizers` version, so the file (and its hash, which
dataset manifests record) only changes when the corpus, the vocab size or that version does.
"""
from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from pathlib import Path

from tokendata.tokenizer import train_bpe

DEFAULT_VOCAB = 4096
CORPUS = Path(__file__).resolve().parents[1] / "peer" / "corpus" / "shakespeare.txt.gz"
ASSET = Path(__file__).resolve().parent / "assets" / "bpe.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokendata.make_bpe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB)
    p.add_argument("-o", "--output", default=str(ASSET))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "corpus.txt"   # the raw file, so this needs no torch (peer.data does)
        text.write_bytes(gzip.decompress(CORPUS.read_bytes()))
        tok = train_bpe([text], args.vocab_size)
    tok.save(args.output)
    print(f"{args.output}: vocab {tok.vocab_size}, eos {tok.eos_id}, hash {tok.hash}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
