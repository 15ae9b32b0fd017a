"""The tokenizers of jaxhc's datasets: UTF-8 bytes, a byte-level BPE, or a given tokenizer.json.

Every tokenizer is a `tokenizers` tokenizer with a ``tokenizer.json`` that transformers loads
(`transformers.PreTrainedTokenizerFast`). The bytes tokenizer is one too: its 256 tokens are the
bytes of the UTF-8 text (token id = byte value), written as a byte-level BPE without merges, so
`jaxhc generate` and transformers decode its ids alike; jaxhc itself encodes and decodes it with
numpy (the same ids, much faster on long texts). The embedded corpus is tokenized by it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

import numpy as np

from jaxhc.data import words

__all__ = ["END_OF_TEXT", "MIN_BPE_VOCAB", "Tokenizer", "byte_to_unicode", "parse_spec"]

END_OF_TEXT = "<|endoftext|>"
MIN_BPE_VOCAB = 257  # the 256 bytes and the end-of-text token
SEPARATOR_TEXT = "\n\n"  # between documents, for a tokenizer without an end-of-text token


def byte_to_unicode() -> dict[int, str]:
    """The visible character of each byte in byte-level BPE vocabularies (GPT-2's convention):
    printable Latin-1 bytes stand for themselves, the others for the characters from U+0100 on,
    in byte order."""
    visible = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in visible:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


def parse_spec(spec: str) -> tuple[str, int | str | None]:
    """``bytes`` -> ("bytes", None); ``bpe:8192`` -> ("bpe", 8192); anything else is a path:
    ("file", the tokenizer.json, or the one in a given folder). One-line errors."""
    if spec == "bytes":
        return "bytes", None
    if spec.startswith("bpe:"):
        size = spec[4:]
        if not size.isdigit() or int(size) < MIN_BPE_VOCAB:
            raise ValueError(
                f"--tokenizer {spec}: VOCAB must be an integer >= {MIN_BPE_VOCAB} "
                f"(256 bytes and {END_OF_TEXT})"
            )
        return "bpe", int(size)
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(
            f"--tokenizer {spec}: no such file (give bytes, bpe:VOCAB or a tokenizer.json)"
        )
    return "file", path


class Tokenizer:
    """A `tokenizers.Tokenizer` and what jaxhc needs of it: its vocabulary size, the tokens put
    between documents (the end-of-text token where it has one, else a blank line), and fast
    numpy encoding of the bytes tokenizer.

    >>> tok = jaxhc.data.Tokenizer.bytes()
    >>> tok.name, tok.vocab_size, tok.encode("hi"), tok.decode([104, 105])
    ('bytes', 256, array([104, 105]), 'hi')
    >>> bpe = jaxhc.data.Tokenizer.train_bpe(jaxhc.data.corpus_texts()[:5], 300)
    >>> bpe.name, bpe.vocab_size
    ('bpe:300', 300)
    """

    def __init__(self, backend, name: str):
        self.backend = backend
        self.name = name  # where it came from, for messages
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.eos_id = backend.token_to_id(END_OF_TEXT)
        spec = json.loads(backend.to_str())
        self.is_bytes = _canonical(backend.to_str()) == _canonical(_bytes_json())
        # Whether a text cut before whitespace that follows a non-whitespace character encodes
        # as the whole does (`jaxhc.data.sources.pieces`): the pre-tokenizer splits there and
        # the normalizer works character by character.
        self.cuts_safely = _splits_at_whitespace(spec.get("pre_tokenizer")) and _local(
            spec.get("normalizer")
        )
        self._words = None
        if not self.is_bytes and words.applies(spec):
            added = [t["content"] for t in spec.get("added_tokens") or []]
            self._words = words.WordCache(backend, added)
        if self.eos_id is not None:
            self.separator = [self.eos_id]
        else:
            self.separator = self.encode(SEPARATOR_TEXT).tolist()

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def bytes(cls) -> Tokenizer:
        """The 256 byte tokens (token id = byte value of the UTF-8 text)."""
        from tokenizers import Tokenizer as Backend

        return cls(Backend.from_str(_bytes_json()), "bytes")

    @classmethod
    def from_file(cls, path: str) -> Tokenizer:
        """A tokenizer.json (written by `tokenizers` or transformers); one-line errors."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read tokenizer {path}: {e}") from None
        return cls.from_json(text, path)

    @classmethod
    def from_json(cls, text: str, name: str) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        try:
            backend = Backend.from_str(text)
        except Exception as e:  # tokenizers raises a plain Exception on a bad file
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{name}: not a tokenizer.json ({first})") from None
        return cls(backend, name)

    @classmethod
    def train_bpe(cls, texts, vocab_size: int, length: int | None = None) -> Tokenizer:
        """A byte-level BPE of `vocab_size` tokens (the end-of-text token among them) trained on
        the strings of the iterable `texts` (GPT-2's pre-tokenization: words, numbers,
        punctuation and spaces split before merging)."""
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, pre_tokenizers, trainers

        backend = Backend(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[END_OF_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        backend.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(backend, f"bpe:{vocab_size}")

    # --- use ------------------------------------------------------------------------------------

    def encode(self, text: str) -> np.ndarray:
        """The token ids of `text` (no special tokens added), as int64."""
        if self.is_bytes:
            return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)
        return np.asarray(self.backend.encode(text, add_special_tokens=False).ids, np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text: a byte-level BPE through `jaxhc.data.words`, other tokenizers
        by the tokenizers library's batch encoding (in parallel, Rust threads)."""
        if self.is_bytes:
            return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
        if self._words is not None:
            return self._words.encode_batch(texts)
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, np.uint32) for e in encodings]

    def decode(self, ids) -> str:
        """The text of `ids` (invalid UTF-8 as U+FFFD, as transformers decodes it)."""
        ids = [int(i) for i in ids]
        if self.is_bytes:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.backend.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        return self.backend.to_str()

    def digest(self) -> str:
        """SHA-256 of the tokenizer's JSON in a canonical form: equal for the same tokenizer."""
        return hashlib.sha256(_canonical(self.to_json()).encode()).hexdigest()

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)


@functools.cache
def _bytes_json() -> str:
    """The bytes tokenizer as tokenizer.json: a byte-level BPE whose vocabulary is the 256 byte
    characters with id = byte value, and no merges."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    chars = byte_to_unicode()
    backend = Backend(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend.to_str()


# Pre-tokenizers that split wherever a whitespace character follows a non-whitespace one (the
# ByteLevel one with its GPT-2 pattern: no pattern runs from a non-space into a space), and
# normalizers that map characters one at a time.
_SPLITTING = ("Whitespace", "WhitespaceSplit", "BertPreTokenizer")
_LOCAL = ("NFC", "NFD", "NFKC", "NFKD", "Lowercase")


def _splits_at_whitespace(pre) -> bool:
    if not isinstance(pre, dict):
        return False
    kind = pre.get("type")
    if kind == "ByteLevel":
        return bool(pre.get("use_regex", True))
    if kind == "Sequence":
        items = pre.get("pretokenizers") or []
        return bool(items) and _splits_at_whitespace(items[0])
    return kind in _SPLITTING


def _local(norm) -> bool:
    if norm is None:
        return True
    if norm.get("type") == "Sequence":
        return all(_local(n) for n in norm.get("normalizers") or [])
    return norm.get("type") in _LOCAL


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)
