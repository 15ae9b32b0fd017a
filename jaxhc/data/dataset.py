"""A tokenized dataset: the embedded corpus, or a folder written by `jaxhc data prepare`.

A prepared folder holds ``meta.json``, ``tokenizer.json`` and the token shards ``train-NNNNN.bin``
and ``val-NNNNN.bin``: flat little-endian ``uint16`` (or ``uint32`` for vocabularies over 65,536
tokens), no header. Opening one checks every shard's size against ``meta.json`` and, unless told
not to, its SHA-256; then the shards are memory-mapped, so a corpus larger than memory trains:
a batch reads only its windows. The training split and the validation split are laid end to end
as one token sequence, the way the embedded corpus is one sequence with its validation tail, and
batches are drawn from it by `jaxhc.data.Batches` alike (depending on (seed, step) only).
"""

from __future__ import annotations

import bisect
import dataclasses
import os

import numpy as np

from jaxhc.data.corpus import Batches, corpus_bytes
from jaxhc.data.sources import hash_file
from jaxhc.data.tokenizer import Tokenizer
from jaxhc.schema import read_json

__all__ = ["FORMAT", "META", "Dataset", "Shards", "read_meta"]

FORMAT = "jaxhc-tokens-1"
META = "meta.json"
TOKENIZER = "tokenizer.json"
DTYPES = {"uint16": "<u2", "uint32": "<u4"}


def read_meta(path: str) -> dict:
    """The ``meta.json`` of prepared dataset `path`; one-line errors naming the file.

    >>> jaxhc.data.read_meta("no/such/folder")
    Traceback (most recent call last):
    ValueError: data.path='no/such/folder': no such folder (prepare one with jaxhc data prepare)
    """
    file = os.path.join(path, META)
    if not os.path.isdir(path):
        raise ValueError(
            f"data.path={path!r}: no such folder (prepare one with jaxhc data prepare)"
        )
    meta = read_json(
        file,
        f"data.path={path!r} is not a prepared dataset: it has no {META} "
        "(prepare one with jaxhc data prepare)",
    )
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{file}: format {got!r} is not {FORMAT!r}")
    return meta


class Shards:
    """Token shards read as one sequence: ``len``, and slices (numpy arrays) that may span
    shards. Each shard is a read-only memory map.

    >>> shards = jaxhc.data.Shards([np.arange(5), np.arange(5, 9)])
    >>> len(shards), shards[3:7]               # a slice across the two shards
    (9, array([3, 4, 5, 6]))
    """

    def __init__(self, arrays: list):
        self.arrays = [a for a in arrays if len(a)]
        self.starts = [0]
        for a in self.arrays:
            self.starts.append(self.starts[-1] + len(a))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("Shards take contiguous slices only")
        lo, hi, _ = index.indices(len(self))
        if hi <= lo:
            return np.zeros(0, self.arrays[0].dtype if self.arrays else np.uint16)
        i = bisect.bisect_right(self.starts, lo) - 1
        parts = []
        while lo < hi:
            a, base = self.arrays[i], self.starts[i]
            take = min(hi, base + len(a))
            parts.append(a[lo - base : take - base])
            lo, i = take, i + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Tokens (training split then validation split), where they split, and their tokenizer.

    `tokens` is a numpy array (the embedded corpus) or `Shards`; `path` is None for the embedded
    corpus.

    >>> ds = jaxhc.data.Dataset.embedded()     # the corpus as bytes; Dataset.open(DIR) for yours
    >>> ds.name, ds.vocab_size, ds.split < len(ds.tokens)
    ('corpus', 256, True)
    """

    name: str
    tokens: object
    split: int
    vocab_size: int
    path: str | None = None

    @classmethod
    def embedded(cls, val_fraction: float = 0.1) -> Dataset:
        """CPython's pydoc topics as bytes (`jaxhc.data.corpus_bytes`), its last tenth held out."""
        tokens = corpus_bytes()
        return cls("corpus", tokens, int(len(tokens) * (1 - val_fraction)), 256)

    @classmethod
    def open(cls, path: str, checksum: bool = True) -> Dataset:
        """The prepared dataset in folder `path`, its shards checked against ``meta.json``
        (sizes always; SHA-256 too when `checksum`): a missing, truncated or altered shard is
        one line naming it."""
        meta = read_meta(path)
        try:
            dtype = np.dtype(DTYPES[meta["dtype"]])
            vocab = int(meta["tokenizer"]["vocab_size"])
            shards = {
                s: [(x["file"], int(x["tokens"]), x["sha256"]) for x in meta["shards"][s]]
                for s in ("train", "val")
            }
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{os.path.join(path, META)} is corrupt: {e!r}") from None
        parts = {
            split: [_open_shard(os.path.join(path, f), n, h, dtype, checksum) for f, n, h in rows]
            for split, rows in shards.items()
        }
        tokens = Shards(parts["train"] + parts["val"])
        split = sum(len(a) for a in parts["train"])
        return cls(path, tokens, split, vocab, path)

    def tokenizer(self) -> Tokenizer:
        if self.path is None:
            return Tokenizer.bytes()
        return Tokenizer.from_file(os.path.join(self.path, TOKENIZER))

    def batches(self, batch_size: int, block_size: int, seed: int) -> Batches:
        return Batches(self.tokens, batch_size, block_size, seed, split=self.split, name=self.name)

    def val_tokens(self) -> np.ndarray:
        """The validation split (a copy, or a view of one shard)."""
        return self.tokens[self.split : len(self.tokens)]


def _open_shard(file: str, tokens: int, sha256: str, dtype, checksum: bool) -> np.ndarray:
    try:
        size = os.path.getsize(file)
    except OSError:
        raise ValueError(f"dataset shard {file} is missing") from None
    want = tokens * dtype.itemsize
    if size != want:
        what = "truncated" if size < want else "longer than written"
        raise ValueError(f"dataset shard {file} is {what}: {size} bytes, {want} in {META}")
    if checksum and hash_file(file) != sha256:
        raise ValueError(
            f"dataset shard {file} is corrupt: its SHA-256 differs from {META}'s "
            "(data.checksum=false skips this check)"
        )
    if not want:
        return np.zeros(0, dtype)
    return np.memmap(file, dtype=dtype, mode="r")
