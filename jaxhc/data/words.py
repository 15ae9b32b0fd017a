"""Faster encoding for byte-level BPE tokenizers: GPT-2's pre-tokenization, then a word cache.

A byte-level BPE (GPT-2's pipeline: no normalizer, the ByteLevel pre-tokenizer with its regular
expression, a BPE model without dropout) encodes every pre-token ("word") on its own, so a word's
ids are the same wherever it occurs. Most of the `tokenizers` library's time on such a tokenizer
goes into its pre-tokenization; here the text is split by the same pattern with the `regex`
module, each distinct word is encoded once by the tokenizer itself, and the text's ids are its
words' ids joined. The ids equal the tokenizer's (tested over the Unicode range against
`tokenizers`); a text holding one of the tokenizer's added tokens (``<|endoftext|>`` ...) is
left to the tokenizer, which matches those before splitting. It runs in one thread: threads
that release the GIL around the matching, and two worker processes, both ran slower than one
thread on this 2-core machine (measured by hand; bench/workflow.py compares the result with the
tokenizers library's own batch encoding).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PATTERN", "WordCache", "applies"]

# The ByteLevel pre-tokenizer's pattern (GPT-2's), its contractions' common quote factored out
# (the same matches, ~15 % faster with the regex module).
PATTERN = r"""'(?:[stmd]|re|ve|ll)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
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
    """Encodes texts as `tokenizers` would (see the module)."""

    def __init__(self, backend, added: list[str]):
        import regex

        self.backend = backend
        self.added = [a for a in added if a]
        self._pattern = regex.compile(PATTERN)
        self._words: dict[str, bytes] = {}

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The ids (uint32) of each text, no special tokens added."""
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> np.ndarray:
        if any(a in text for a in self.added):
            return np.asarray(self.backend.encode(text, add_special_tokens=False).ids, np.uint32)
        if len(self._words) > MAX_WORDS:
            self._words.clear()
        words = self._pattern.findall(text)
        got = list(map(self._words.get, words))
        if None in got:
            new = list({w for w, g in zip(words, got, strict=True) if g is None})
            encoded = self.backend.encode_batch_fast(new, add_special_tokens=False)
            for word, e in zip(new, encoded, strict=True):
                self._words[word] = np.asarray(e.ids, np.uint32).tobytes()
            got = list(map(self._words.__getitem__, words))
        return np.frombuffer(b"".join(got), np.uint32)
