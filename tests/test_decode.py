"""Decoding with the key/value cache against the full forward pass and transformers' greedy
generation."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from jaxhc.model import gpt
from jaxhc.model.decode import forward, generate, init_cache, keep_tokens
from tests._gpt import CFG, LLAMA, SEED


def random_params(cfg):
    """Random parameters of `cfg`'s shapes (numpy: no initializer to compile)."""
    shapes = jax.eval_shape(lambda: gpt.init_params(cfg, SEED))
    rng = np.random.default_rng(SEED)
    return jax.tree.map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(np.float32), shapes)


@pytest.fixture(scope="module")
def params():
    return random_params(CFG)


@pytest.mark.parametrize("cfg", [CFG, LLAMA], ids=["gpt2", "llama"])
def test_cached_logits_equal_the_full_forward(cfg):
    params = random_params(cfg)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, cfg.vocab_size, (2, cfg.block_size)).astype(np.int32)
    full = np.asarray(jax.jit(gpt.logits, static_argnums=2)(params, idx, cfg))
    n = 5  # a prompt of 5, then one token at a time
    logits, cache = forward(params, idx[:, :n], 0, init_cache(cfg, 2), cfg)
    np.testing.assert_allclose(np.asarray(logits), full[:, :n], rtol=1e-5, atol=1e-5)
    step = jax.jit(lambda p, t, pos, c: forward(p, t, pos, c, cfg))
    for pos in range(n, cfg.block_size):
        logits, cache = step(params, idx[:, pos : pos + 1], pos, cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full[:, pos], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # a transformers model to build (the chain holds without it: the cached logits
# equal gpt.logits here, and gpt.logits equals transformers' in test_model_hf.py)
def test_greedy_generation_is_transformers_most_likely_tokens():
    """Greedy decoding of an imported transformers model: each token is the argmax of
    transformers' logits after the prompt and the tokens before it (its greedy search)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from jaxhc.model import from_hf_gpt2

    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=4, n_head=4)
    hf = transformers.FlaxGPT2LMHeadModel(config, seed=1)
    cfg, params = from_hf_gpt2(hf)
    assert cfg == CFG  # the other tests' compiled programs serve it
    prompt = [5, 17, 3, 60, 2]
    ours = generate(params, cfg, prompt, 11, temperature=0.0)
    logits = np.asarray(hf(np.array([prompt + ours[:-1]])).logits)[0]
    assert ours == np.argmax(logits[len(prompt) - 1 :], axis=-1).tolist()


def test_past_the_context_each_token_follows_its_window(params):
    """Beyond block_size the context restarts from its last `keep_tokens` tokens: each greedy
    token is the full forward pass's most likely one after its window."""
    prompt = [1, 2, 3]
    out = generate(params, CFG, prompt, 40, temperature=0.0)
    t, keep = CFG.block_size, keep_tokens(CFG)
    assert len(out) == 40 and keep == 12
    full = jax.jit(lambda p, idx: gpt.logits(p, idx, CFG))
    context = list(prompt)
    for token in out:
        padded = np.zeros((1, t), np.int32)
        padded[0, : len(context)] = context  # causal: the padding after it changes nothing
        logits = np.asarray(full(params, padded))[0, len(context) - 1]
        assert token == int(np.argmax(logits))
        context = context[-keep + 1 :] + [token] if len(context) == t else context + [token]


def test_sampling_is_seeded_and_respects_top_k_and_the_vocabulary(params):
    greedy = generate(params, CFG, [7], 30, temperature=0.0)
    assert generate(params, CFG, [7], 30, temperature=1.0, top_k=1, seed=4) == greedy
    a = generate(params, CFG, [7], 30, temperature=1.0, seed=1)
    assert a == generate(params, CFG, [7], 30, temperature=1.0, seed=1)
    assert a != generate(params, CFG, [7], 30, temperature=1.0, seed=2)
    small = generate(params, CFG, [7], 30, temperature=2.0, vocab=10, seed=3)
    assert max(small) < 10 and len(set(small)) > 3
    assert generate(params, CFG, [7], 30, temperature=1.0, eos_id=greedy[0], top_k=1) == [greedy[0]]
