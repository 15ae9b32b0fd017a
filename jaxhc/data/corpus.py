"""The embedded training corpus (English text that ships with CPython) and a resumable sampler."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxhc.data.tokenizer import SEPARATOR_TEXT

VOCAB_SIZE = 256  # byte-level tokens


def corpus_texts() -> list[str]:
    """CPython's pydoc topic help, one document per topic (sorted by name).

    >>> texts = jaxhc.data.corpus_texts()
    >>> len(texts), texts[0][:22]
    (79, 'The "assert" statement')
    """
    from pydoc_data import topics

    return [topics.topics[k] for k in sorted(topics.topics)]


def corpus_bytes() -> np.ndarray:
    """CPython's pydoc topic help (~0.45 MB of English prose and code), as uint8 tokens.

    >>> tokens = jaxhc.data.corpus_bytes()
    >>> tokens.dtype, bytes(tokens[:14])
    (dtype('uint8'), b'The "assert" s')
    """
    text = SEPARATOR_TEXT.join(corpus_texts())  # the documents as `jaxhc data prepare` joins them
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


@dataclasses.dataclass(frozen=True)
class Batches:
    """Random windows of `block_size + 1` tokens; batch `step` depends only on (seed, step).

    That makes a resumed run see exactly the batches an uninterrupted run would, on any mesh.
    `tokens` is any 1-D sequence that slices into arrays (a numpy array, or the memory-mapped
    shards of a prepared dataset, `jaxhc.data.Shards`): the tokens before `split` are the
    training split, the rest is held out for evaluation (default split: the last
    `val_fraction` of the tokens). `name` says which corpus an error is about.

    >>> batches = jaxhc.data.Batches(jaxhc.data.corpus_bytes(), batch_size=4, block_size=16)
    >>> batches.train(0).shape                 # inputs and their next tokens, one window a row
    (4, 17)
    >>> bool((batches.train(7) == batches.train(7)).all()), batches.val(0).shape
    (True, (4, 17))
    """

    tokens: Any
    batch_size: int
    block_size: int
    seed: int = 0
    val_fraction: float = 0.1
    split: int | None = None
    name: str = "corpus"

    def __post_init__(self):
        span = self.block_size + 1
        if self._split < 2 * span:
            raise ValueError(
                f"{self.name} of {len(self.tokens)} tokens is too small for "
                f"block_size={self.block_size}"
            )
        if len(self.tokens) - self._split <= span:
            raise ValueError(
                f"the validation split of {self.name} ({len(self.tokens) - self._split} tokens) "
                f"is too small for block_size={self.block_size}"
            )

    @property
    def _split(self) -> int:
        if self.split is not None:
            return self.split
        return int(len(self.tokens) * (1 - self.val_fraction))

    def train(self, step: int) -> np.ndarray:
        """int32 [batch_size, block_size + 1] for training step `step`."""
        return self._windows(0, self._split, np.random.default_rng([self.seed, 0, step]))

    def val(self, index: int) -> np.ndarray:
        """int32 [batch_size, block_size + 1] from the held-out tail, the `index`-th eval batch."""
        return self._windows(
            self._split, len(self.tokens), np.random.default_rng([self.seed, 1, index])
        )

    def _windows(self, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
        span = self.block_size + 1
        starts = rng.integers(lo, hi - span, size=self.batch_size)
        return np.stack([self.tokens[s : s + span] for s in starts]).astype(np.int32)
