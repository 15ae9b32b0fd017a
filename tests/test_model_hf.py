"""jaxhc's GPT against transformers' FlaxGPT2LMHeadModel (random init, offline)."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from jaxhc.model import from_hf_gpt2, gpt  # noqa: E402
from jaxhc.parallel import from_single, make_logits  # noqa: E402
from tests._gpt import POLICIES, mesh_of  # noqa: E402


@pytest.fixture(scope="module")
def hf_model():
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=4, n_head=4)
    return transformers.FlaxGPT2LMHeadModel(config, seed=0)


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(7).integers(0, 64, (8, 16)).astype(np.int32)


@pytest.fixture(scope="module")
def hf_logits(hf_model, inputs):
    return np.asarray(hf_model(inputs).logits)


def test_config_and_layout(hf_model):
    cfg, params = from_hf_gpt2(hf_model)
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd) == (
        64,
        16,
        4,
        4,
        32,
    )
    # transformers stores c_attn's kernel as (3C, C): row which*C + head*D + d.
    hf_kernel = np.asarray(hf_model.params["transformer"]["h"]["1"]["attn"]["c_attn"]["kernel"])
    assert hf_kernel.shape == (96, 32)
    which, head, d, c = 2, 3, 5, 7
    got = params["blocks"]["attn"]["c_attn"]["kernel"][1, c, which, head, d]
    assert got == hf_kernel[which * 32 + head * 8 + d, c]


def test_logits_on_one_device(hf_model, inputs, hf_logits):
    cfg, params = from_hf_gpt2(hf_model)
    ours = jax.jit(gpt.logits, static_argnums=2)(params, inputs, cfg)
    np.testing.assert_allclose(np.asarray(ours), hf_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("policy", ["none", "identity"])
def test_logits_on_2x2x2_mesh(hf_model, inputs, hf_logits, policy):
    cfg, params = from_hf_gpt2(hf_model)
    mesh_cfg, mesh = mesh_of("2x2x2")
    logits = make_logits(cfg, mesh_cfg, mesh, POLICIES[policy])
    ours = logits(from_single(params, mesh), inputs)
    np.testing.assert_allclose(np.asarray(ours), hf_logits, atol=1e-4, rtol=1e-4)


def test_rejects_other_architectures():
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=4, activation_function="relu"
    )
    with pytest.raises(ValueError, match="activation_function='relu'"):
        from_hf_gpt2(transformers.FlaxGPT2LMHeadModel(config, seed=0))
