"""Training data: the embedded corpus, prepared datasets of token shards, their tokenizers.

`Dataset.embedded()` is CPython's pydoc text as bytes; `Dataset.open(DIR)` a folder written by
`jaxhc data prepare` (`jaxhc.data.prepare.prepare`), memory-mapped; `Batches` draws training and
validation windows from either, depending on (seed, step) only. `Tokenizer` is the bytes
tokenizer, a byte-level BPE or any tokenizer.json.

>>> jaxhc.data.VOCAB_SIZE                      # the embedded corpus: one token per byte
256
"""

from jaxhc.data.corpus import VOCAB_SIZE as VOCAB_SIZE
from jaxhc.data.corpus import Batches as Batches
from jaxhc.data.corpus import corpus_bytes as corpus_bytes
from jaxhc.data.corpus import corpus_texts as corpus_texts
from jaxhc.data.dataset import Dataset as Dataset
from jaxhc.data.dataset import Shards as Shards
from jaxhc.data.dataset import read_meta as read_meta
from jaxhc.data.tokenizer import Tokenizer as Tokenizer

__all__ = [
    "VOCAB_SIZE",
    "Batches",
    "Dataset",
    "Shards",
    "Tokenizer",
    "corpus_bytes",
    "corpus_texts",
    "read_meta",
]
