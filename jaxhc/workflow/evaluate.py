"""`jaxhc eval`: a run's loss and perplexity on a validation split, on one device.

The split (the run's own data, or another prepared dataset with the same tokenizer) is read as
consecutive windows of ``block_size`` predictions (the first ``max_tokens`` of them at most), each
token predicted from the ones before it in its window.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from jaxhc.data import Dataset
from jaxhc.model import gpt
from jaxhc.workflow.run import Run

__all__ = ["evaluate"]

BATCH = 16  # windows per compiled batch


def evaluate(
    run_dir: str, data: str | None = None, *, step: int | None = None, max_tokens: int = 1 << 20
) -> dict:
    """``{"loss", "perplexity", "tokens", "step", "data"}`` of the run's model at checkpoint
    `step` (default: the latest) on the validation split of `data` (default: the run's)."""
    if max_tokens < 1:
        raise ValueError(f"--max-tokens {max_tokens} must be >= 1")
    run = Run(run_dir)
    path = data if data is not None else run.data
    dataset = Dataset.embedded() if path is None else Dataset.open(path)
    theirs, ours = dataset.tokenizer(), run.tokenizer()
    if theirs.digest() != ours.digest():
        raise ValueError(
            f"--data {path}: its tokenizer is not the one {run_dir} was trained with "
            f"({theirs.vocab_size} and {ours.vocab_size} tokens)"
        )
    cfg = run.model
    t = cfg.block_size
    val = np.asarray(dataset.val_tokens())
    windows = min((len(val) - 1) // t, max(1, max_tokens // t))
    if windows < 1:
        raise ValueError(f"the validation split of {dataset.name} is shorter than block_size={t}")
    step, params = run.params(step)
    params = jax.device_put(params)
    losses = _token_losses(cfg)
    total, count = 0.0, 0
    for lo in range(0, windows, BATCH):
        rows = [val[i * t : i * t + t + 1] for i in range(lo, min(windows, lo + BATCH))]
        n = len(rows)
        rows += [rows[-1]] * (BATCH - n)  # a full batch: one compiled shape
        per_token = np.asarray(losses(params, np.stack(rows).astype(np.int32)), np.float64)
        total += per_token[:n].sum()
        count += per_token[:n].size
    loss = total / count
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": count,
        "step": step,
        "data": dataset.name,
    }


@functools.cache
def _token_losses(cfg):
    @jax.jit
    def losses(params, tokens):
        return gpt.token_losses(gpt.logits(params, tokens[:, :-1], cfg), tokens[:, 1:])

    return losses
