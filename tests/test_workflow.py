"""The commands after training, end to end on one small run (2 x 2 x 2 mesh, a prepared BPE
dataset): generate and eval on one device, against the reference model."""

from __future__ import annotations

import math

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


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, dataset dir, overrides) of a 2-step run on a prepared dataset."""
    root = tmp_path_factory.mktemp("workflow")
    (root / "a.txt").write_text(SAMPLE * 3)
    data = root / "ds"
    prepare([str(root / "a.txt")], str(data), "bpe:300", progress=False)
    overrides = [*TINY, f"data.path={data}", "train.steps=2", "--compression", "none"]
    out = root / "run"
    assert cli.main(["train", "--out", str(out), "--no-progress", *overrides]) == 0
    return out, data, overrides


def reference_params(run):
    """The checkpoint's parameters as the trainer's own reader assembles them."""
    out, _, overrides = run
    cfg = load(None, [o for o in overrides if not o.startswith("--") and o != "none"])
    plan = Plan(cfg.model, cfg.mesh, cfg.optim)
    return cfg.model, plan.single_params(
        Checkpoints(str(out / "checkpoints")).read_global(plan).params
    )


def test_generate_greedy_follows_the_reference_model(run, capsys):
    out, data, _ = run
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
    out, data, _ = run
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
    out, _, _ = run
    other = tmp_path / "bytes"
    (tmp_path / "t.txt").write_text(SAMPLE)
    prepare([str(tmp_path / "t.txt")], str(other), "bytes", progress=False)
    cases = [
        (["generate", "--run", str(tmp_path), "--prompt", "x"], "has no config.json"),
        (["generate", "--run", str(out), "--prompt", "x", "--step", "1"], "no checkpoint of it"),
        (["generate", "--run", str(out), "--prompt", "x", "--top-k", "-1"], "--top-k -1"),
        (["eval", "--run", str(out), "--data", str(other)], "is not the one"),
    ]
    for args, message in cases:
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert Run(str(out)).model.vocab_size == 300
