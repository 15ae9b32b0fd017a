"""Data sets of the codec benchmarks: jaxhc's own GPT tensors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["gpt_sets", "hf_gpt2_gradients", "reference_sets"]


def gpt_sets(quick: bool, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """jaxhc's GPT at init: weights, gradients of one corpus batch, residual stream per block."""
    from jaxhc.data import Batches, corpus_bytes
    from jaxhc.model import GPTConfig, gpt
    from jaxhc.model.layers import Block

    cfg = GPTConfig(
        vocab_size=256,
        block_size=64 if quick else 128,
        n_layer=2 if quick else 4,
        n_head=4,
        n_embd=128 if quick else 256,
    )
    params = gpt.init_params(cfg, seed)
    tokens = jnp.asarray(Batches(corpus_bytes(), 4 if quick else 16, cfg.block_size, seed).train(0))
    grads = jax.grad(gpt.loss)(params, tokens, cfg)
    block = Block(cfg)

    def layer(h, p):
        h = block.apply({"params": p}, h)
        return h, h

    _, acts = jax.lax.scan(layer, gpt.embed(params, tokens[:, :-1], cfg), params["blocks"])
    leaves = lambda tree: [np.asarray(a, np.float32) for a in jax.tree.leaves(tree)]  # noqa: E731
    return {
        "gpt weights": leaves(params),
        "gpt gradients": leaves(grads),
        "gpt activations": list(np.asarray(acts, np.float32)),
    }


def hf_gpt2_gradients(seed: int = 0) -> dict[str, list[np.ndarray]]:
    """The gradients of a transformers GPT-2 (`FlaxGPT2LMHeadModel`, GPT-2's vocabulary of 50257
    tokens and its tied head, 4 layers of width 256, random init, offline) on one corpus batch of
    16 x 128 byte tokens: a second model's gradients, initialized and laid out by transformers."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import optax
    import transformers

    from jaxhc.data import Batches, corpus_bytes

    config = transformers.GPT2Config(n_positions=128, n_embd=256, n_layer=4, n_head=4)
    model = transformers.FlaxGPT2LMHeadModel(config, seed=seed)
    tokens = jnp.asarray(Batches(corpus_bytes(), 16, 128, seed).train(0))

    def loss(params):
        logits = model(tokens[:, :-1], params=params).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    grads = jax.grad(loss)(model.params)
    return {"gpt-2 gradients": [np.asarray(a, np.float32) for a in jax.tree.leaves(grads)]}


def reference_sets(n: int = 1 << 20, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """i.i.d. samples of a Gaussian and of heavier tails (Laplace, Student's t with 4 degrees of
    freedom): where a block quantizer's error stands against the tails of its data."""
    rng = np.random.default_rng(seed)
    return {
        "gaussian": [rng.standard_normal(n, dtype=np.float32)],
        "laplace": [rng.laplace(size=n).astype(np.float32)],
        "student t4": [rng.standard_t(4, n).astype(np.float32)],
    }
