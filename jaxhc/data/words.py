"""Faster encoding for byte-level BPE tokenizers: GPT-2's pre-tokenization, then a word cache.

A byte-level BPE (GPT-2's pipeline: no normalizer, the ByteLevel pre-tokenizer with its regular
expression, a BPE model without dropout) encodes every pre-token ("word") on its own, so a word's
ids are the same wherever it occurs. Most of the `tokenizers` library's time on such a tokenizer
goes into its pre-tokenization; here the text is split by the same pattern with the `regex`
module (matching with the GIL released, in threads), each distinct word is encoded once by the
tokenizer itself, and the text's ids are its words' ids joined. The ids equal the tokenizer's
(tested over the Unicode range against `tokenizers`); a text holding one of the tokenizer's added
tokens (``<|endoftext|>`` ...) is left to the tokenizer, which matches those before splitting.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["WordCache", "applies"]

# The ByteLevel pre-tokenizer's pattern (GPT-2's).
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MAX_WORDS = 1 << 21  # the cache is emptied when it holds this many words


def applies(spec: dict) -> bool:
    """Whether the tokenizer.json `spec` is a byte-level BPE whose words encode alone."""
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    return (
        spec.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and not pre.get("add_prefix_space", True)
        and pre.get("use_regex", True)
        and model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("byte_fallback")
    )


class WordCache:
    """Encodes texts as `tokenizers` would (see the module), `threads` splitting at once."""

    def __init__(self, backend, added: list[str], threads: int | None = None):
        import regex

        self.backend = backend
        self.added = [a for a in added if a]
        self._pattern = regex.compile(PATTERN)
        self._words: dict[str, bytes] = {}
        self._pool = ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1))

    def _split(self, text: str) -> list[str]:
        return self._pattern.findall(text, concurrent=True)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The ids (uint32) of each text, no special tokens added."""
        out = []
        for text, words in zip(texts, self._pool.map(self._split, texts), strict=True):
            if any(a in text for a in self.added):
                out.append(np.asarray(self.backend.encode(text, add_special_tokens=False).ids))
                continue
            if len(self._words) > MAX_WORDS:
                self._words.clear()
            got = list(map(self._words.get, words))
            if None in got:
                new = list({w for w, g in zip(words, got, strict=True) if g is None})
                encoded = self.backend.encode_batch_fast(new, add_special_tokens=False)
                for word, e in zip(new, encoded, strict=True):
                    self._words[word] = np.asarray(e.ids, np.uint32).tobytes()
                got = list(map(self._words.__getitem__, words))
            out.append(np.frombuffer(b"".join(got), np.uint32))
        return out
