"""`jaxhc generate`: text from a run's checkpoint, on one device, with a key/value cache."""

from __future__ import annotations

import time

from jaxhc.model.decode import generate
from jaxhc.workflow.run import Run

__all__ = ["generate_text"]


def generate_text(
    run_dir: str,
    prompt: str,
    max_new_tokens: int,
    *,
    step: int | None = None,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
) -> dict:
    """Continue `prompt` with up to `max_new_tokens` tokens of the run's model at checkpoint
    `step` (default: the latest), decoded with the run's tokenizer. Returns the text and what
    produced it: ``{"text", "tokens", "step", "seconds"}``."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens} must be >= 1")
    if not temperature >= 0:
        raise ValueError(f"--temperature {temperature} must be >= 0 (0: the most likely token)")
    if top_k < 0:
        raise ValueError(f"--top-k {top_k} must be >= 0 (0: no limit)")
    run = Run(run_dir)
    tokenizer = run.tokenizer()
    ids = tokenizer.encode(prompt).tolist()
    if not ids:
        if tokenizer.eos_id is None:
            raise ValueError("--prompt is empty (and the tokenizer has no end-of-text token)")
        ids = [tokenizer.eos_id]
    step, params = run.params(step)
    t0 = time.perf_counter()
    new = generate(
        params,
        run.model,
        ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        vocab=min(tokenizer.vocab_size, run.model.vocab_size),
        eos_id=tokenizer.eos_id,
    )
    seconds = time.perf_counter() - t0
    return {"text": tokenizer.decode(new), "tokens": new, "step": step, "seconds": seconds}
