"""Fast encoding of whole batches to one flat token array.

tokenizers' own pipeline costs about 3 MB of text per CPU-second (most of it per-byte
alignment bookkeeping that a dataset build never reads). Two exact shortcuts:

  byte   the ids are the UTF-8 bytes: numpy straight from `str.encode`.
  BPE    for a byte-level BPE whose only pre-tokenizer is GPT-2's ByteLevel regex (the
         shipped tokenizer and every one `train_bpe` makes), a text's ids are the
         concatenation of each regex word's ids, so words are split here with the same
         pattern (the `regex` module) and each distinct word is encoded once by the
         tokenizer itself and cached: ~8 MB/CPU-second on English text.

Anything else (another tokenizer.json) goes through `Tokenizer.encode_batch`. `FlatEncoder`
checks its shortcut against tokenizers on a sample of awkward text before using it and
falls back if they disagree; tests compare the two on random Unicode.
"""
from __future__ import annotations

import itertools
import json

import numpy as np

from tokendata.tokenizer import Tokenizer

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MAX_CACHED_WORDS = 1 << 19           # bounds the cache (~100 MB) on text with endless distinct words
SELF_CHECK = ("Hello, world! It's 12³ o'clock\r\n\r\n  indented\ttab\x0b\x0c\x1c\x85\u00a0\u2028\u3000 "
              "日本語のテキスト 🎉🎉 naïve café e\u0301 ½ Ⅻ ٣ x_y '  's 'S 'll  \n\n\n   end  ")


def _bpe_shortcut_applies(tok: Tokenizer) -> bool:
    d = json.loads(tok.to_json_str())
    pre, model = d.get("pre_tokenizer") or {}, d.get("model") or {}
    return (d.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)
            and model.get("type") == "BPE" and not model.get("dropout")
            and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
            and all(t.get("special") for t in d.get("added_tokens", [])))


class FlatEncoder:
    """encode(texts, doc_ends) -> one array of ids, EOS after each text that ends a document."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.dtype = tokenizer.token_dtype
        self.mode = "tokenizers"
        if tokenizer.name == "byte" and tokenizer.vocab_size == 257 and tokenizer.eos_id == 256:
            self.mode = "byte"
        elif _bpe_shortcut_applies(tokenizer):
            import regex  # only for the shortcut
            self._split = regex.compile(GPT2_PATTERN).findall
            self._cache: dict[str, list[int]] = {}
            self.mode = "words"
            if self._words([SELF_CHECK]).tolist() != tokenizer.encode(SELF_CHECK):
                self.mode = "tokenizers"  # e.g. a `regex` whose Unicode tables differ from onig's

    def encode(self, texts: list[str], doc_ends: list[bool]) -> np.ndarray:
        eos = np.array([self.tok.eos_id], dtype=self.dtype)
        if self.mode == "byte":
            parts = []
            for text, end in zip(texts, doc_ends):
                parts.append(np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(self.dtype))
                if end:
                    parts.append(eos)
            return np.concatenate(parts) if parts else np.zeros(0, self.dtype)
        if self.mode == "words":
            parts = []
            for text, end in zip(texts, doc_ends):
                parts.append(self._words([text]))
                if end:
                    parts.append(eos)
            return np.concatenate(parts) if parts else np.zeros(0, self.dtype)
        encoded = self.tok.encode_batch(texts)
        chunks = (ids + [self.tok.eos_id] if end else ids for ids, end in zip(encoded, doc_ends))
        total = sum(len(ids) + end for ids, end in zip(encoded, doc_ends))
        return np.fromiter(itertools.chain.from_iterable(chunks), dtype=self.dtype, count=total)

    def _words(self, texts: list[str]) -> np.ndarray:
        words = [w for text in texts for w in self._split(text)]
        got = list(map(self._cache.get, words))
        missing = [i for i, ids in enumerate(got) if ids is None]
        if missing:
            if len(self._cache) > MAX_CACHED_WORDS:
                self._cache.clear()
            new = list(dict.fromkeys(words[i] for i in missing))
            for word, ids in zip(new, self.tok.encode_batch(new)):
                self._cache[word] = ids
            for i in missing:
                got[i] = self._cache[words[i]]
        return np.fromiter(itertools.chain.from_iterable(got), dtype=self.dtype, count=sum(map(len, got)))
