"""The embedded training corpus (English text that ships with CPython) and a resumable sampler."""

from __future__ import annotations

import dataclasses

import numpy as np

VOCAB_SIZE = 256  # byte-level tokens


def corpus_bytes() -> np.ndarray:
    """CPython's pydoc topic help (~0.45 MB of English prose and code), as uint8 tokens."""
    from pydoc_data import topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


@dataclasses.dataclass(frozen=True)
class Batches:
    """Random windows of `block_size + 1` tokens; batch `step` depends only on (seed, step).

    That makes a resumed run see exactly the batches an uninterrupted run would. The last
    `val_fraction` of the corpus is held out for evaluation.
    """

    tokens: np.ndarray
    batch_size: int
    block_size: int
    seed: int = 0
    val_fraction: float = 0.1

    def __post_init__(self):
        if len(self.tokens) * (1 - self.val_fraction) < 2 * (self.block_size + 1):
            raise ValueError(
                f"corpus of {len(self.tokens)} tokens is too small for block_size={self.block_size}"
            )

    @property
    def _split(self) -> int:
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
