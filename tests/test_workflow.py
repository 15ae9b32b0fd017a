"""The workflow end to end on one small run: a transformers GPT-2 imported (`--init hf:`),
trained two steps on a prepared BPE dataset on a 2 x 2 x 2 mesh, then generate and eval on one
device against the reference model, and export back to transformers (its logits, its
tokenizer)."""

from __future__ import annotations

import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from jaxhc import cli
from jaxhc.data import Dataset, Tokenizer
from jaxhc.data.prepare import prepare
from jaxhc.model import gpt
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import load
from jaxhc.workflow import Run, evaluate, generate_text
from tests.test_data import SAMPLE
from tests.test_train import TINY

# One training run (a few compilations) serves every test here: `make test-all` runs them.
pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
# TINY's model (2 layers, width 32, 4 heads, context 16) with 32 positions: the run keeps 16.
HF_CONFIG = dict(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, dataset dir, overrides, transformers model) of a 2-step run on a prepared
    dataset, started from a transformers GPT-2 folder."""
    root = tmp_path_factory.mktemp("workflow")
    (root / "a.txt").write_text(SAMPLE * 3)
    data = root / "ds"
    prepare([str(root / "a.txt")], str(data), "bpe:300", progress=False)
    hf = transformers.FlaxGPT2LMHeadModel(transformers.GPT2Config(**HF_CONFIG), seed=3)
    hf.save_pretrained(root / "hf")
    init = ["--init", f"hf:{root / 'hf'}"]
    overrides = [*TINY, f"data.path={data}", "train.steps=2", "--compression", "none", *init]
    out = root / "run"
    assert cli.main(["train", "--out", str(out), "--no-progress", *overrides]) == 0
    return out, data, overrides, hf


def reference_params(run):
    """The checkpoint's parameters as the trainer's own reader assembles them."""
    out, _, overrides, _ = run
    cfg = load(None, [o for o in overrides if "=" in o and not o.startswith("hf:")])
    plan = Plan(cfg.model, cfg.mesh, cfg.optim)
    return cfg.model, plan.single_params(
        Checkpoints(str(out / "checkpoints")).read_global(plan).params
    )


def test_generate_greedy_follows_the_reference_model(run, capsys):
    out, data, _, _ = run
    model, params = reference_params(run)
    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    prompt = "It's 3.14"
    result = generate_text(str(out), prompt, 8, temperature=0.0)
    context = tok.encode(prompt).tolist()
    assert len(context) + 8 <= model.block_size
    full = jax.jit(lambda p, idx: gpt.logits(p, idx, model))
    for token in result["tokens"]:  # each the most likely after what came before
        padded = np.zeros((1, model.block_size), np.int32)
        padded[0, : len(context)] = context
        logits = np.asarray(full(params, padded))[0, len(context) - 1]
        assert token == int(np.argmax(logits[: tok.vocab_size]))
        context.append(token)
    assert result["step"] == 2 and result["text"] == tok.decode(result["tokens"])
    args = ["generate", "--run", str(out), "--prompt", prompt, "--max-new-tokens", "8"]
    assert cli.main([*args, "--temperature", "0"]) == 0
    assert capsys.readouterr().out == prompt + result["text"] + "\n"


def test_eval_is_the_mean_loss_over_the_validation_windows(run):
    out, data, _, _ = run
    model, params = reference_params(run)
    val = np.asarray(Dataset.open(str(data)).val_tokens())
    t = model.block_size
    rows = np.stack([val[i * t : i * t + t + 1] for i in range((len(val) - 1) // t)])
    want = float(gpt.loss(params, rows.astype(np.int32), model))
    r = evaluate(str(out))
    assert r["tokens"] == rows.shape[0] * t and r["step"] == 2
    assert r["loss"] == pytest.approx(want, rel=1e-5)
    assert r["perplexity"] == pytest.approx(math.exp(want), rel=1e-5)
    assert evaluate(str(out), str(data), max_tokens=t)["tokens"] == t


def test_bad_arguments_are_one_line(run, tmp_path, capsys):
    out, _, _, _ = run
    other = tmp_path / "bytes"
    (tmp_path / "t.txt").write_text(SAMPLE)
    prepare([str(tmp_path / "t.txt")], str(other), "bytes", progress=False)
    cases = [
        (["generate", "--run", str(tmp_path), "--prompt", "x"], "has no config.json"),
        (["generate", "--run", str(out), "--prompt", "x", "--step", "1"], "no checkpoint of it"),
        (["generate", "--run", str(out), "--prompt", "x", "--top-k", "-1"], "--top-k -1"),
        (["eval", "--run", str(out), "--data", str(other)], "is not the one"),
        (["export", "--run", str(out), "--hf", str(out)], "is not an empty folder"),
    ]
    for args, message in cases:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert Run(str(out)).model.vocab_size == 300


def test_the_import_starts_from_the_transformers_model(run):
    """Step 0's loss (before any update) is transformers' cross-entropy of that batch."""
    out, data, _, hf = run
    tokens = Dataset.open(str(data)).batches(8, 16, 0).train(0)
    shifted = np.asarray(hf(tokens[:, :-1]).logits, np.float64)
    shifted -= shifted.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, tokens[:, 1:, None], -1).mean()
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["loss"] == pytest.approx(want, rel=1e-5)


def test_export_loads_in_transformers_with_jaxhc_logits(run, tmp_path):
    out, data, _, _ = run
    model, params = reference_params(run)
    assert cli.main(["export", "--run", str(out), "--hf", str(tmp_path / "hf")]) == 0
    idx = np.random.default_rng(1).integers(0, 300, (2, 16)).astype(np.int32)
    want = np.asarray(gpt.logits(params, idx, model))
    flax = transformers.FlaxGPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    np.testing.assert_allclose(np.asarray(flax(idx).logits), want, atol=1e-4, rtol=1e-4)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        pt = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        with torch.no_grad():
            got = pt(torch.from_numpy(idx.astype(np.int64))).logits.numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = Tokenizer.from_file(str(data / "tokenizer.json"))
    assert tok(SAMPLE)["input_ids"] == ours.encode(SAMPLE).tolist()
    assert (
        tok.eos_token == "<|endoftext|>"
        and tok.eos_token_id == ours.eos_id == flax.config.eos_token_id
    )


def test_a_bytes_run_exports_a_tokenizer_of_the_utf8_bytes(run, tmp_path):
    """A run on the embedded corpus has no tokenizer.json: the export writes the bytes one."""
    out, _, _, _ = run
    bytes_run = tmp_path / "run"
    shutil.copytree(out, bytes_run)
    (bytes_run / "tokenizer.json").unlink()
    config = json.loads((bytes_run / "config.json").read_text())
    (bytes_run / "config.json").write_text(json.dumps({**config, "data": None}))
    assert cli.main(["export", "--run", str(bytes_run), "--hf", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "Bytes: é ☃\n"
    assert tok(text)["input_ids"] == list(text.encode("utf-8"))
    assert tok.decode(list(text.encode("utf-8"))) == text
