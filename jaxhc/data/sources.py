"""The documents of `jaxhc data prepare`'s inputs: text files, folders of them, JSON lines, gzip.

A text file is one document; a ``.jsonl`` (or ``.ndjson``) file holds one document per line, the
string under its `field`; ``.gz`` files are read through gzip (``notes.txt.gz``,
``docs.jsonl.gz``). Folders are walked recursively in name order (hidden names skipped). Files are
UTF-8 (a byte-order mark is dropped; line endings are kept as they are). Each input's raw bytes
are hashed as they are read, so a re-run can tell the same input from a changed one.

Documents come as pieces cut where a tokenizer's pre-tokenization breaks anyway (before a
whitespace character that follows a non-whitespace one), so long documents can be encoded in
parallel without changing their tokens.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator

__all__ = ["Input", "find_inputs", "hash_file", "pieces"]

BLOCK_CHARS = 1 << 22  # characters read from a text file at a time
PIECE_CHARS = 1 << 16  # the size pieces of a long document are cut to, about
SEARCH_CHARS = 1 << 20  # how far past the target a cut is looked for
JSONL = (".jsonl", ".ndjson")


class Input:
    """One input file: its path, size, modification time and (once read) SHA-256."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror}") from None
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
        self.sha256: str | None = None
        inner = self.path[:-3] if self.path.endswith(".gz") else self.path
        self.gzip = inner != self.path
        self.jsonl = inner.endswith(JSONL)

    def record(self) -> dict:
        return {
            "path": self.path,
            "bytes": self.size,
            "mtime_ns": self.mtime_ns,
            "sha256": self.sha256,
        }

    def documents(self, field: str, progress=None, cut: bool = True) -> Iterator[tuple[bool, str]]:
        """(whether it starts a document, text) of each piece of the file's documents, in order
        (`cut` False: each document whole); `progress(n)` is told of every n raw bytes read."""
        raw = _Hashing(self.path, progress)
        stream = io.BufferedReader(raw, 1 << 20)
        if self.gzip:
            stream = gzip.GzipFile(fileobj=stream, mode="rb")
        text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="strict", newline="")
        try:
            if self.jsonl:
                docs = ((pieces(d) if cut else [d]) for d in self._lines(text, field))
            else:
                docs = [_cut(_blocks(text)) if cut else [text.read()]]
            for doc in docs:
                first = True
                for piece in doc:
                    yield first, piece
                    first = False
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: not UTF-8 text ({e.reason})") from None
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise ValueError(f"cannot read {self.path}: {e}") from None
        finally:
            text.close()
        self.sha256 = raw.hexdigest()

    def _lines(self, text, field: str) -> Iterator[Iterator[str]]:
        for number, line in enumerate(text, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{self.path}:{number}: not a JSON line ({e.msg})") from None
            if not isinstance(value, dict) or field not in value:
                raise ValueError(f"{self.path}:{number}: no field {field!r} (see --field)")
            doc = value[field]
            if not isinstance(doc, str):
                raise ValueError(
                    f"{self.path}:{number}: field {field!r} is {type(doc).__name__}, not a string"
                )
            if doc:
                yield doc


def hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def find_inputs(paths: list[str]) -> list[Input]:
    """The files of the given paths (folders walked recursively in name order); one-line errors
    for a missing path or no file at all."""
    out = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
            if not found:
                raise ValueError(f"{path}: the folder holds no files")
            out += [Input(f) for f in found]
        elif os.path.exists(path):
            out.append(Input(path))
        else:
            raise ValueError(f"{path}: no such file or folder")
    if not out:
        raise ValueError("no input given")
    return out


def pieces(text: str) -> Iterator[str]:
    """`text` cut into pieces of about PIECE_CHARS characters at safe places (see the module)."""
    return _cut(iter((text,)))


def _blocks(text) -> Iterator[str]:
    while block := text.read(BLOCK_CHARS):
        yield block


def _cut(blocks: Iterator[str]) -> Iterator[str]:
    """The concatenation of `blocks` in pieces cut before a whitespace character that follows a
    non-whitespace one (a line break preferred), at least PIECE_CHARS apart."""
    carry = ""
    for block in blocks:
        carry += block
        start = 0
        while len(carry) - start > PIECE_CHARS:
            cut = _safe_cut(carry, start + PIECE_CHARS)
            if cut is None:
                break
            yield carry[start:cut]
            start = cut
        carry = carry[start:]
    if carry:
        yield carry


def _safe_cut(text: str, target: int) -> int | None:
    """The first index >= target of a whitespace character (a line break if one comes within
    SEARCH_CHARS) whose predecessor is not whitespace; None if there is none yet."""
    for sep in ("\n", " "):
        i = text.find(sep, target, target + SEARCH_CHARS)
        while i != -1:
            if not text[i - 1].isspace():
                return i
            i = text.find(sep, i + 1, target + SEARCH_CHARS)
    return None


class _Hashing(io.RawIOBase):
    """A file read for its bytes that hashes them on the way and reports progress."""

    def __init__(self, path: str, progress=None):
        try:
            self._f = open(path, "rb")  # noqa: SIM115 (closed with the wrapper)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror}") from None
        self._h = hashlib.sha256()
        self._progress = progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        if n:
            self._h.update(memoryview(buffer)[:n])
            if self._progress is not None:
                self._progress(n)
        return n

    def close(self) -> None:
        self._f.close()
        super().close()

    def hexdigest(self) -> str:
        return self._h.hexdigest()
