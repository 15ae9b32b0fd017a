"""`jaxhc data prepare` and prepared datasets: tokens against the tokenizers library and the
input text, the embedded corpus as one prepared case, re-runs, damage and bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxhc import cli
from jaxhc.data import Dataset, Tokenizer, corpus_bytes, corpus_texts
from jaxhc.data.prepare import prepare
from jaxhc.data.sources import pieces

ROOT = Path(__file__).resolve().parent.parent
# Text whose whitespace runs, contractions, digits and non-ASCII characters exercise the GPT-2
# pre-tokenization at the places documents are cut.
SAMPLE = (
    "It's 3.14 -- isn't it?\n\n  Indented  line\twith\ttabs \n"
    "Ünïcödé ☃ and 𝄞; numbers 12345 67 8.\r\nWindows line\r\n   \n" * 40
)


def docs(tmp_path: Path) -> Path:
    """A folder with a text file, a gzip'd text file and a .jsonl.gz of three documents."""
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(SAMPLE, encoding="utf-8", newline="")
    with gzip.open(folder / "sub" / "b.txt.gz", "wt", encoding="utf-8", newline="") as f:
        f.write("Second document.\nIt ends here.")
    lines = [json.dumps({"text": t, "id": i}) for i, t in enumerate(["one", "two 2", "three ☃"])]
    with gzip.open(folder / "sub" / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n")
    (folder / ".hidden").write_text("not read")
    return folder


EXPECTED_DOCS = [SAMPLE, "Second document.\nIt ends here.", "one", "two 2", "three ☃"]


def all_tokens(path) -> np.ndarray:
    d = Dataset.open(str(path))
    return np.asarray(d.tokens[0 : len(d.tokens)]), d


def test_bytes_tokenizer_json_maps_text_to_its_utf8_bytes():
    from tokenizers import Tokenizer as Backend
    from transformers import PreTrainedTokenizerFast

    text = SAMPLE + "".join(chr(c) for c in range(1, 0x250)) + "\x00\x7f\ud7ff\U0010ffff"
    want = list(text.encode("utf-8"))
    tok = Tokenizer.bytes()
    assert tok.vocab_size == 256 and tok.is_bytes and tok.eos_id is None
    assert Backend.from_str(tok.to_json()).encode(text).ids == want
    fast = PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(tok.to_json()))
    assert fast(text)["input_ids"] == want
    assert fast.decode(want) == text == tok.decode(want)
    assert tok.encode(text).tolist() == want


def test_the_embedded_corpus_is_the_bytes_dataset_of_its_documents(tmp_path):
    folder = tmp_path / "topics"
    folder.mkdir()
    for i, text in enumerate(corpus_texts()):
        (folder / f"{i:04d}.txt").write_text(text, encoding="utf-8", newline="")
    meta = prepare(
        [str(folder)], str(tmp_path / "ds"), "bytes", shard_tokens=100_000, progress=False
    )
    tokens, prepared = all_tokens(tmp_path / "ds")
    embedded = Dataset.embedded()
    np.testing.assert_array_equal(tokens, corpus_bytes())
    assert meta["dtype"] == "uint16" and len(meta["shards"]["train"]) == 5
    assert prepared.split == embedded.split == meta["tokens"]["train"]
    a, b = prepared.batches(8, 64, 3), embedded.batches(8, 64, 3)
    for step in (0, 1, 77):
        np.testing.assert_array_equal(a.train(step), b.train(step))
    np.testing.assert_array_equal(a.val(2), b.val(2))


def test_bpe_dataset_decodes_to_the_documents_and_matches_tokenizers(tmp_path):
    from tokenizers import Tokenizer as Backend

    meta = prepare(
        [str(docs(tmp_path))],
        str(tmp_path / "ds"),
        "bpe:300",
        shard_tokens=1000,
        val_fraction=0.25,
        progress=False,
    )
    out = tmp_path / "ds"
    tokens, dataset = all_tokens(out)
    backend = Backend.from_file(str(out / "tokenizer.json"))
    eos = backend.token_to_id("<|endoftext|>")
    assert meta["tokenizer"]["vocab_size"] == backend.get_vocab_size() == 300
    # The shards hold each document as tokenizers encodes it whole, end-of-text between them.
    want = []
    for i, doc in enumerate(EXPECTED_DOCS):
        want += ([eos] if i else []) + backend.encode(doc, add_special_tokens=False).ids
    assert tokens.tolist() == want
    assert backend.decode(want, skip_special_tokens=False).split("<|endoftext|>") == EXPECTED_DOCS
    assert dataset.split == int(len(want) * 0.75) == meta["tokens"]["train"]
    assert meta["documents"] == 5 and len(meta["shards"]["train"]) >= 2
    for split in ("train", "val"):
        for shard in meta["shards"][split]:
            data = (out / shard["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert len(data) == 2 * shard["tokens"]  # flat little-endian uint16
    inputs = [os.path.basename(i["path"]) for i in meta["inputs"]]
    assert inputs == ["a.txt", "b.txt.gz", "c.jsonl.gz"]
    assert isinstance(dataset.tokens.arrays[0], np.memmap)


def test_long_documents_are_cut_where_tokens_do_not_change():
    tok = Tokenizer.train_bpe([SAMPLE], 400)
    text = SAMPLE * 40  # ~100 k characters: several pieces
    cut = list(pieces(text))
    assert len(cut) > 1 and "".join(cut) == text
    whole = tok.backend.encode(text, add_special_tokens=False).ids
    assert np.concatenate(tok.encode_batch(cut)).tolist() == whole


def test_a_large_vocabulary_gives_uint32_shards(tmp_path):
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    words = sorted(set(SAMPLE.split())) + [f"w{i}" for i in range(70_000)]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, "[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    text = " ".join(["w69999", "w5"] * 30) + " " + SAMPLE
    (tmp_path / "t.txt").write_text(text)
    meta = prepare([str(tmp_path / "t.txt")], str(tmp_path / "ds"), str(path), progress=False)
    assert meta["dtype"] == "uint32" and meta["tokenizer"]["vocab_size"] == len(words) + 1
    tokens, _ = all_tokens(tmp_path / "ds")
    sep = backend.encode("\n\n", add_special_tokens=False).ids
    assert sep == [] and tokens.tolist() == backend.encode(text, add_special_tokens=False).ids


def test_rerun_is_a_no_op_and_other_output_is_refused(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text(SAMPLE)
    out = str(tmp_path / "ds")
    first = prepare([str(src)], out, "bytes", progress=False)
    stamps = {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in os.listdir(out)}
    os.utime(src)  # touched, same bytes: still the same input
    assert prepare([str(src)], out, "bytes", progress=False)["status"] == "up to date"
    assert {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in os.listdir(out)} == stamps
    assert first["status"] == "prepared"
    with pytest.raises(ValueError, match=r"holds another dataset \(its val_fraction is 0.1"):
        prepare([str(src)], out, "bytes", val_fraction=0.2, progress=False)
    src.write_text(SAMPLE + "more")
    with pytest.raises(ValueError, match=f"{src} changed since it was prepared"):
        prepare([str(src)], out, "bytes", progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a prepared dataset"):
        prepare([str(src)], str(tmp_path / "other"), "bytes", progress=False)


def test_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    (tmp_path / "e").mkdir()
    out = str(tmp_path / "ds")
    cases = [
        ([str(tmp_path / "empty.txt")], "bytes", "empty.txt: no text in the input"),
        ([str(tmp_path / "latin1.txt")], "bytes", "latin1.txt: not UTF-8 text"),
        ([str(tmp_path / "bad.jsonl")], "bytes", "bad.jsonl:2: no field 'text' (see --field)"),
        ([str(tmp_path / "nothing")], "bytes", "nothing: no such file or folder"),
        ([str(tmp_path / "e")], "bytes", "e: the folder holds no files"),
        ([str(tmp_path / "empty.txt")], "bpe:100", "VOCAB must be an integer >= 257"),
        ([str(tmp_path / "empty.txt")], "tok.json", "--tokenizer tok.json: no such file"),
    ]
    for inputs, spec, message in cases:
        rc = cli.main(
            ["data", "prepare", *inputs, "--out", out, "--tokenizer", spec, "--no-progress"]
        )
        err = capsys.readouterr().err
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not os.path.exists(out) and not os.path.exists(out + ".partial")


def test_damaged_shards_are_refused_naming_them(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text(SAMPLE)
    out = tmp_path / "ds"
    prepare([str(src)], str(out), "bytes", progress=False)
    shard = out / "train-00000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"dataset shard {shard} is corrupt"):
        Dataset.open(str(out))
    assert Dataset.open(str(out), checksum=False).tokens[10:11][0] == data[20]  # checked off
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(ValueError, match=f"dataset shard {shard} is truncated"):
        Dataset.open(str(out), checksum=False)


def test_progress_under_a_pipe_is_plain_lines(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text(SAMPLE * 50)
    cmd = [
        sys.executable,
        "-m",
        "jaxhc.cli",
        "data",
        "prepare",
        str(src),
        "--out",
        str(tmp_path / "ds"),
        "--tokenizer",
        "bpe:260",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text, repr(text)
    assert "tokenizing: 100 %" in done.stderr and "validation tokens" in done.stdout


def test_the_word_cache_encodes_as_tokenizers_does():
    """A byte-level BPE is encoded through `jaxhc.data.words` (its own split of the text, a cache
    of words): the ids are the tokenizers library's, over the Unicode range in several contexts,
    added tokens in the text included."""
    rng = np.random.default_rng(0)
    chars = [chr(c) for c in range(1, 0x3100) if not 0xD800 <= c < 0xE000]
    chars += [chr(c) for c in rng.integers(0x3100, 0x110000, 4000) if not 0xD800 <= c < 0xE000]
    chars += ["\u3000", "\ufeff", "\U0001f600"]
    tok = Tokenizer.train_bpe([SAMPLE, "".join(chars)], 600)
    assert tok._words is not None  # the fast path is the one under test
    texts = [
        "".join(f"a{c}b {c}1{c}  {c}{c}\n" for c in chars[i : i + 500])
        for i in range(0, len(chars), 500)
    ]
    texts += [SAMPLE, "x <|endoftext|> y", "it's  \n\n  'll'S 'd' 3'", " " * 5 + "\t\n" * 3]
    want = tok.backend.encode_batch_fast(texts, add_special_tokens=False)
    got = tok.encode_batch(texts)
    for text, w, g in zip(texts, want, got, strict=True):
        assert g.tolist() == w.ids, text[:80]
    assert tok.encode_batch(texts[:3])[2].tolist() == want[2].ids  # from the cache
