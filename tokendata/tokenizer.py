"""Tokenizers as Hugging Face `tokenizers` objects, so that every one exports as tokenizer.json.

    byte  UTF-8 bytes 0..255 as ids 0..255, EOS (<|endoftext|>) = 256: the ids peer/data.py's
          ByteTokenizer always gave, now as a BPE model with no merges over the 256 ByteLevel
          byte-characters (in byte order), so it loads in transformers like any other.
    bpe   byte-level BPE trained on the embedded corpus, shipped as tokendata/assets/bpe.json
          (regenerate: python -m tokendata.make_bpe).
    FILE  any tokenizer.json (e.g. from `skippipe-coordinator tokenizer`).

A tokenizer's identity is `hash`: sha256 of its canonical tokenizer.json (keys sorted, no
whitespace), which manifests and run specs carry so that data and model agree.
"""
from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
SHIPPED = ("byte", "bpe")
_BPE_ASSET = "bpe.json"


class TokenizerError(ValueError):
    """A tokenizer spec or file is missing, corrupt or unusable (one-line message)."""


def padded_vocab_size(n: int, multiple: int = 64) -> int:
    """The smallest multiple of `multiple` >= n (model embedding rows; 257 -> 320)."""
    if n < 1 or multiple < 1:
        raise ValueError("vocab size and multiple must be >= 1")
    return -(-n // multiple) * multiple


def canonical_json(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Tokenizer:
    """A `tokenizers.Tokenizer` with the identity and EOS this project needs."""

    def __init__(self, inner: HFTokenizer, name: str):
        self.inner, self.name = inner, name
        # Text that happens to contain "<|endoftext|>" is encoded as its bytes, never as EOS:
        # EOS marks document boundaries only (and byte ids stay exactly ByteTokenizer's).
        self.inner.encode_special_tokens = True
        eos = inner.token_to_id(EOS_TOKEN)
        if eos is None:
            raise TokenizerError(f"tokenizer {name} has no {EOS_TOKEN} token")
        self.eos_id: int = eos
        self.vocab_size: int = inner.get_vocab_size(with_added_tokens=True)
        self.hash: str = hashlib.sha256(canonical_json(inner.to_str()).encode()).hexdigest()

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 65536 else np.uint32)

    def encode(self, text: str, eos: bool = False) -> list[int]:
        ids = self.inner.encode(text, add_special_tokens=False).ids
        return ids + [self.eos_id] if eos else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Parallel (tokenizers' thread pool) and without offsets, for throughput."""
        return [e.ids for e in self.inner.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        """Ids outside the vocabulary (model padding rows) and EOS are dropped."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self.inner.decode([i for i in ids if 0 <= i < self.vocab_size and i != self.eos_id],
                                 skip_special_tokens=True)

    def to_json_str(self) -> str:
        return self.inner.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json_str())

    def hf_config(self, model_max_length: int | None = None) -> dict:
        """tokenizer_config.json for a Hugging Face model folder next to tokenizer.json.
        split_special_tokens: literal "<|endoftext|>" in a prompt is text, as in `encode`."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
                  "bos_token": EOS_TOKEN, "unk_token": None, "pad_token": EOS_TOKEN,
                  "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
                  "split_special_tokens": True}
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        return config

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, hash={self.hash[:12]})"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ByteLevel pre-tokenizers emit)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer() -> Tokenizer:
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    inner = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split and no prefix space: every byte maps to its own id, nothing else happens.
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens([EOS_TOKEN])
    return Tokenizer(inner, "byte")


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """'byte', 'bpe' (the shipped one) or a path to a tokenizer.json."""
    spec = str(spec)
    if spec == "byte":
        return byte_tokenizer()
    if spec == "bpe":
        text = (importlib.resources.files("tokendata") / "assets" / _BPE_ASSET).read_text()
        return _from_text(text, "bpe", "shipped BPE tokenizer")
    path = Path(spec)
    if not path.is_file():
        raise TokenizerError(f"tokenizer {spec!r} is not 'byte', 'bpe' or an existing tokenizer.json file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer: {getattr(exc, 'strerror', None) or exc}") from None
    return _from_text(text, str(path), str(path))


def _from_text(text: str, name: str, where: str) -> Tokenizer:
    try:
        json.loads(text)
        inner = HFTokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise TokenizerError(f"{where}: not a valid tokenizer.json ({first})") from None
    return Tokenizer(inner, name)


def train_bpe(paths: Iterable[str | Path], vocab_size: int,
              progress: Callable[[int], None] | None = None) -> Tokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenization) with <|endoftext|>, trained by streaming
    the inputs' documents (see readers); `progress(bytes_read)` is called as text goes in."""
    from tokendata.readers import expand_inputs, iter_all
    if vocab_size < 257:
        raise TokenizerError(f"--vocab-size {vocab_size} is below 257 (256 bytes + {EOS_TOKEN})")
    files = expand_inputs(paths)
    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)

    def texts() -> Iterator[str]:
        done = 0
        for piece in iter_all(files):
            done += piece.nbytes
            if progress is not None:
                progress(done)
            yield piece.text

    inner.train_from_iterator(texts(), trainer=trainer)
    return Tokenizer(inner, "bpe")
