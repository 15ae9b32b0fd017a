"""The training workflow's own costs: preparing a corpus, reading batches, generating text.

    flock /tmp/jaxhc-bench.lock .venv/bin/python bench/workflow.py --out bench/results/workflow.json

1. `jaxhc data prepare` of ~64 MB of English text with an 8k byte-level BPE: the tokenizer's
   training time and the tokenizing throughput (input MB per second, reading and writing
   included; a byte-level BPE goes through jaxhc.data.words' word cache), and for comparison the
   tokenizers library's own batch encoding (its Rust threads) of the first 4 MB file's pieces,
   held in memory. The text is what
   this machine has on disk, offline: CPython's pydoc topics, the docstrings of the standard
   library's modules, then the plain-text files (and gzip'd ones) under /usr/share/doc (Debian's
   copyright files and changelogs), in name order, until --mb.
2. Reading batches from the prepared shards (memory-mapped) at the default run's batch (32 x 65
   tokens) against the default step (configs/experiments/default.yaml, embedded corpus, 8
   simulated CPU devices, zhybrid), both measured here.
3. Generating 256 tokens from that default model on one CPU device: the first call (compiling
   the prefill and the decode step) and a second one; `jaxhc generate` as a command too.

Targets: >= 5 MB/s tokenizing; batch reads < 1 % of the default step; 256 tokens < 5 s.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

from jaxhc.launch import set_cpu_device_count

set_cpu_device_count(8)  # the default mesh, before jax starts

import _common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def corpus(folder: str, mb: float) -> dict:
    """Write ~`mb` MB of English text into `folder` as files of ~4 MB; what it came from."""
    from pydoc_data import topics

    limit, written, parts, sources = int(mb * 1e6), 0, [], {}

    def add(source: str, text: str) -> bool:
        nonlocal written
        if not text.strip():
            return written < limit
        parts.append(text)
        sources[source] = sources.get(source, 0) + len(text.encode())
        written += len(text.encode())
        return written < limit

    for k in sorted(topics.topics):
        add("pydoc_data.topics", topics.topics[k])
    stdlib = sysconfig.get_paths()["stdlib"]
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "site-packages", "__pycache__"))
        for name in sorted(f for f in files if f.endswith(".py")):
            try:
                tree = ast.parse(open(os.path.join(root, name), encoding="utf-8").read())
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                    if not add("stdlib docstrings", ast.get_docstring(node) or ""):
                        break
            if written >= limit:
                break
        if written >= limit:
            break
    for root, dirs, files in os.walk("/usr/share/doc") if written < limit else ():
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if os.path.islink(path) or not name.endswith((".gz", "copyright", ".txt")):
                continue
            try:
                raw = gzip.open(path).read() if name.endswith(".gz") else open(path, "rb").read()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            if not add("/usr/share/doc", text) or written >= limit:
                break
        if written >= limit:
            break
    text = "\n\n".join(parts)
    size = 4_000_000
    for i in range(0, len(text), size):
        with open(os.path.join(folder, f"{i // size:03d}.txt"), "w", encoding="utf-8") as f:
            f.write(text[i : i + size])
    return {"mb": round(len(text.encode()) / 1e6, 2), "bytes_by_source": sources}


def encode_only(tok, pieces: list[str]) -> float:
    """MB/s of the tokenizers library's own batch encoding of `pieces` (its Rust threads)."""
    mb = sum(len(p.encode()) for p in pieces) / 1e6
    t = time.perf_counter()
    tok.backend.encode_batch_fast(pieces, add_special_tokens=False)
    return mb / (time.perf_counter() - t)


def default_steps(out: str, steps: int) -> dict:
    """Train the default config `steps` steps; the median step seconds (first step left out)."""
    from jaxhc.train.config import load
    from jaxhc.train.loop import train

    cfg = load(
        os.path.join(ROOT, "configs", "experiments", "default.yaml"),
        [f"train.steps={steps}", f"train.ckpt_every={steps}", f"train.eval_every={steps}"],
    )
    train(cfg, out, progress=False)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        seconds = [json.loads(line)["seconds"] for line in f][1:]
    return {"steps": steps, "median_s": statistics.median(seconds), "min_s": min(seconds)}


def batch_reads(data: str, n: int) -> dict:
    from jaxhc.data import Dataset

    batches = Dataset.open(data, checksum=False).batches(32, 64, 0)
    batches.train(0)
    t = time.perf_counter()
    for step in range(n):
        batches.train(step)
    return {"batches": n, "shape": [32, 65], "mean_s": (time.perf_counter() - t) / n}


def generation(run: str, tokens: int) -> dict:
    from jaxhc.model.decode import generate
    from jaxhc.workflow import Run

    t = time.perf_counter()
    r = Run(run)
    _, params = r.params()
    prompt = r.tokenizer().encode("The ").tolist()
    load_s = time.perf_counter() - t
    calls = []
    for seed in (0, 1):
        t = time.perf_counter()
        out = generate(params, r.model, prompt, tokens, temperature=0.8, seed=seed)
        calls.append(time.perf_counter() - t)
        assert len(out) == tokens
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "jaxhc"),
        "generate",
        "--run",
        run,
        "--prompt",
        "The ",
        "--max-new-tokens",
        str(tokens),
    ]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "XLA_FLAGS": ""})
    command_s = time.perf_counter() - t
    return {
        "tokens": tokens,
        "block_size": r.model.block_size,
        "read_checkpoint_s": load_s,
        "first_call_s": calls[0],
        "second_call_s": calls[1],
        "command_s": command_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/workflow.json")
    ap.add_argument("--mb", type=float, default=64, help="MB of English text to prepare")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=30, help="default-config steps to time")
    args = ap.parse_args()
    from jaxhc.data import Tokenizer
    from jaxhc.data.prepare import mb_per_s, prepare
    from jaxhc.data.sources import find_inputs

    with tempfile.TemporaryDirectory() as tmp:
        text, data = os.path.join(tmp, "text"), os.path.join(tmp, "data")
        os.makedirs(text)
        made = corpus(text, args.mb)
        print(f"corpus: {made}", flush=True)
        meta = prepare([text], data, f"bpe:{args.vocab}", progress=False)
        tok = Tokenizer.from_file(os.path.join(data, "tokenizer.json"))
        pieces = [p for _, p in find_inputs([text])[0].documents("text")]
        prep = {
            "vocab_size": meta["tokenizer"]["vocab_size"],
            "input_mb": meta["input_bytes"] / 1e6,
            "tokens": meta["tokens"],
            "bpe_training_s": meta["seconds"]["tokenizer"],
            "tokenize_s": meta["seconds"]["tokenize"],
            "tokenize_mb_per_s": mb_per_s(meta),
            "tokenizers_batch_encoding_mb_per_s": encode_only(tok, pieces),
            "tokenizers_compared_on_mb": sum(len(p.encode()) for p in pieces) / 1e6,
        }
        print(f"prepare: {prep}", flush=True)
        reads = batch_reads(data, 2000)
        step = default_steps(os.path.join(tmp, "run"), args.steps)
        print(f"batches: {reads}, step: {step}", flush=True)
        gen = generation(os.path.join(tmp, "run"), 256)
        print(f"generation: {gen}", flush=True)
    share = reads["mean_s"] / step["median_s"]
    _common.write_json(
        args.out,
        {
            "corpus": made,
            "prepare": prep,
            "batches": {**reads, "default_step": step, "share_of_step": share},
            "generation": gen,
            "targets": {
                "tokenize_mb_per_s >= 5": prep["tokenize_mb_per_s"] >= 5,
                "batch read < 1 % of the default step": share < 0.01,
                "256 tokens < 5 s (first call)": gen["first_call_s"] < 5,
            },
        },
    )


if __name__ == "__main__":
    main()
