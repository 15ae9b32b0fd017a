"""`jaxhc data prepare`: text in, token shards, a tokenizer and ``meta.json`` out.

The inputs (`jaxhc.data.sources`) are tokenized by the bytes tokenizer, a byte-level BPE trained
on them (``bpe:VOCAB``, with the `tokenizers` library, on up to ``bpe_sample_mb`` MB of their
text) or a given tokenizer.json, in parallel batches; documents are separated by the end-of-text
token (or a blank line where the tokenizer has none). The tokens go to shards of `shard_tokens`
tokens; the last `val_fraction` of them (the end of the last inputs) becomes the validation split.
The folder is written beside `out` and renamed into place when complete, so an interrupted run
leaves nothing half-written. Running again with the same inputs and options does nothing; an
`out` that holds something else is refused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time

import numpy as np

from jaxhc.data.dataset import DTYPES, FORMAT, META, TOKENIZER, read_meta
from jaxhc.data.progress import Meter
from jaxhc.data.sources import Input, find_inputs, hash_file
from jaxhc.data.tokenizer import Tokenizer, parse_spec

__all__ = ["DEFAULT_SHARD_TOKENS", "mb_per_s", "prepare"]

DEFAULT_SHARD_TOKENS = 1 << 27  # 256 MiB of uint16 tokens a shard
BATCH_CHARS = 1 << 23  # text encoded per parallel batch
COPY_TOKENS = 1 << 24  # tokens moved at a time into the validation split


def prepare(
    inputs: list[str],
    out: str,
    tokenizer: str = "bytes",
    *,
    field: str = "text",
    val_fraction: float = 0.1,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    bpe_sample_mb: float = 512,
    command: str | None = None,
    progress: bool | None = None,
) -> dict:
    """Tokenize `inputs` into the dataset folder `out` (see the module); returns its
    ``meta.json`` contents, with ``"status"`` "prepared" or "up to date". `progress`: a bar on
    a terminal, plain lines elsewhere (None: as the output is; False: silent)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction} must be between 0 and 1")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"--shard-tokens {shard_tokens} must be a positive integer")
    if not bpe_sample_mb > 0:
        raise ValueError(f"--bpe-sample-mb {bpe_sample_mb} must be > 0")
    kind, arg = parse_spec(tokenizer)
    files = find_inputs(inputs)
    options = {
        "tokenizer": tokenizer if kind != "file" else "file",
        "field": field,
        "val_fraction": val_fraction,
        "shard_tokens": shard_tokens,
    }
    if kind == "file":
        options["tokenizer_sha256"] = hash_file(arg)
    if kind == "bpe":
        options["bpe_sample_mb"] = bpe_sample_mb
    out = os.path.normpath(out)
    if os.path.exists(out):
        meta = _existing(out, files, options)
        if meta is not None:
            return {**meta, "status": "up to date"}

    meter = Meter(progress)
    t0 = time.perf_counter()
    tmp = f"{out}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        if kind == "bytes":
            tok = Tokenizer.bytes()
        elif kind == "file":
            tok = Tokenizer.from_file(arg)
        else:
            tok = _train_bpe(files, field, arg, bpe_sample_mb, meter)
        t1 = time.perf_counter()
        dtype = np.dtype(DTYPES["uint16"] if tok.vocab_size <= 1 << 16 else DTYPES["uint32"])
        train, counts = _encode(files, field, tok, tmp, dtype, shard_tokens, meter)
        t2 = time.perf_counter()
        total = sum(n for _, n in train)
        split = int(total * (1 - val_fraction))
        if split == 0 or split == total:
            names = ", ".join(inputs)
            raise ValueError(
                f"{names}: {total} tokens are too few to hold out a validation split"
                if total
                else f"{names}: no text in the input"
            )
        train, val = _hold_out(train, split, tmp, dtype, shard_tokens)
        tok.save(os.path.join(tmp, TOKENIZER))
        meta = {
            "format": FORMAT,
            "dtype": np.dtype(dtype).name,
            "tokenizer": {
                "spec": tokenizer,
                "vocab_size": tok.vocab_size,
                "file": TOKENIZER,
                "digest": tok.digest(),
                "separator": tok.separator,
            },
            "tokens": {"train": split, "val": total - split},
            "documents": counts["documents"],
            "input_bytes": counts["bytes"],
            "inputs": [f.record() for f in files],
            "options": options,
            "shards": {"train": _records(tmp, train), "val": _records(tmp, val)},
            "command": command,
            "seconds": {
                "tokenizer": round(t1 - t0, 3),
                "tokenize": round(t2 - t1, 3),
                "total": round(time.perf_counter() - t0, 3),
            },
        }
        _write_json(os.path.join(tmp, META), meta)
        if os.path.exists(out):  # an empty folder (checked by _existing)
            os.rmdir(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**meta, "status": "prepared"}


def _existing(out: str, files: list[Input], options: dict) -> dict | None:
    """The meta.json of `out` if it is this very dataset (then nothing needs doing); None if
    `out` is an empty folder; otherwise a one-line error saying what differs."""
    if not os.path.isdir(out):
        raise ValueError(f"--out {out} exists and is not a folder")
    if not os.path.exists(os.path.join(out, META)):
        if os.listdir(out):
            raise ValueError(f"--out {out} exists and is not a prepared dataset (no {META})")
        return None
    meta = read_meta(out)
    other = f"--out {out} holds another dataset"
    hint = "choose another --out or delete it"
    for key, value in options.items():
        if meta["options"].get(key) != value:
            raise ValueError(
                f"{other} (its {key} is {meta['options'].get(key)!r}, not {value!r}): {hint}"
            )
    before = [i["path"] for i in meta["inputs"]]
    if before != [f.path for f in files]:
        new = next((f.path for f in files if f.path not in before), None)
        what = f"{new} is new" if new else "the list of inputs differs"
        raise ValueError(f"{other}, prepared from other inputs ({what}): {hint}")
    for f, rec in zip(files, meta["inputs"], strict=True):
        same = f.size == rec["bytes"] and (
            f.mtime_ns == rec["mtime_ns"] or hash_file(f.path) == rec["sha256"]
        )
        if not same:
            raise ValueError(f"{other}: {f.path} changed since it was prepared: {hint}")
    for split in ("train", "val"):
        for shard in meta["shards"][split]:
            path = os.path.join(out, shard["file"])
            if not os.path.exists(path) or os.path.getsize(path) != shard["bytes"]:
                raise ValueError(
                    f"{out} is damaged ({shard['file']} is missing or of another size): "
                    "delete it and prepare again"
                )
    return meta


def _texts(files: list[Input], field: str, meter: Meter | None = None, cut: bool = True):
    """(starts a document, piece) of every input, in order (`cut` False: whole documents)."""
    for f in files:
        yield from f.documents(field, meter.advance if meter is not None else None, cut)


def _train_bpe(files, field: str, vocab: int, sample_mb: float, meter: Meter) -> Tokenizer:
    """A byte-level BPE trained on the first `sample_mb` MB of the inputs' text."""
    limit = int(sample_mb * 1e6)

    def sample():
        seen = 0
        for _, piece in _texts(files, field):
            yield piece
            seen += len(piece)
            if seen >= limit:
                return

    with meter.phase(f"training a {vocab}-token BPE", None):
        return Tokenizer.train_bpe(sample(), vocab)


def _encode(files, field, tok: Tokenizer, folder, dtype, shard_tokens, meter: Meter):
    """Every input's tokens into training shards; ([(file, tokens)], counts)."""
    writer = _ShardWriter(folder, "train", dtype, shard_tokens)
    sep = np.asarray(tok.separator, dtype)
    counts = {"documents": 0, "bytes": sum(f.size for f in files)}
    batch: list[str] = []
    starts: list[bool] = []
    size = 0

    def flush():
        for first, ids in zip(starts, tok.encode_batch(batch), strict=True):
            if first:
                if counts["documents"]:
                    writer.write(sep)
                counts["documents"] += 1
            writer.write(ids.astype(dtype, copy=False))
        batch.clear()
        starts.clear()

    with meter.phase("tokenizing", counts["bytes"]):
        for first, piece in _texts(files, field, meter, tok.cuts_safely):
            batch.append(piece)
            starts.append(first)
            size += len(piece)
            if size >= BATCH_CHARS:
                flush()
                size = 0
        flush()
    return writer.close(), counts


def _hold_out(train, split: int, folder: str, dtype, shard_tokens: int):
    """Move the tokens from `split` on out of the training shards into validation shards."""
    val = _ShardWriter(folder, "val", dtype, shard_tokens)
    kept, start = [], 0
    for file, n in train:
        cut = min(max(split - start, 0), n)
        if cut < n:
            tokens = np.memmap(file, dtype=dtype, mode="r")
            for lo in range(cut, n, COPY_TOKENS):
                val.write(np.array(tokens[lo : min(n, lo + COPY_TOKENS)]))
            del tokens
            if cut:
                os.truncate(file, cut * dtype.itemsize)
            else:
                os.remove(file)
        if cut:
            kept.append((file, cut))
        start += n
    return kept, val.close()


class _ShardWriter:
    """Tokens appended to ``<prefix>-00000.bin``, ``-00001`` ... of `shard_tokens` each."""

    def __init__(self, folder: str, prefix: str, dtype, shard_tokens: int):
        self.folder, self.prefix, self.dtype, self.limit = folder, prefix, dtype, shard_tokens
        self.shards: list[tuple[str, int]] = []
        self._file = None
        self._n = 0

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, self.dtype)
        while len(ids):
            if self._file is None or self._n == self.limit:
                self._next()
            take = min(len(ids), self.limit - self._n)
            self._file.write(ids[:take].tobytes())
            self._n += take
            ids = ids[take:]

    def _next(self) -> None:
        self._close_file()
        path = os.path.join(self.folder, f"{self.prefix}-{len(self.shards):05d}.bin")
        self._file = open(path, "wb")  # noqa: SIM115 (closed by _close_file)
        self.shards.append((path, 0))
        self._n = 0

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self.shards[-1] = (self.shards[-1][0], self._n)

    def close(self) -> list[tuple[str, int]]:
        self._close_file()
        self._file = None
        return self.shards


def _records(folder: str, shards) -> list[dict]:
    return [
        {
            "file": os.path.basename(path),
            "tokens": n,
            "bytes": os.path.getsize(path),
            "sha256": hash_file(path),
        }
        for path, n in shards
    ]


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def mb_per_s(meta: dict) -> float:
    """Input MB tokenized per second (the tokenizing phase) of a prepare's meta.json."""
    seconds = meta["seconds"]["tokenize"]
    return meta["input_bytes"] / 1e6 / seconds if seconds > 0 else math.inf
