"""jaxhc's LLaMA against transformers' (random init, offline, perturbed weights), on one device
and on a 2 x 2 x 2 mesh, and its configuration errors."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxhc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from jaxhc.model import (  # noqa: E402
    GPTConfig,
    OptimConfig,
    ShardConfig,
    from_hf,
    gpt,
    logits,
)
from jaxhc.model.hf import from_state_dict, to_state_dict  # noqa: E402
from jaxhc.model.hf_io import initial_params, load_pretrained, save_pretrained  # noqa: E402
from jaxhc.parallel import (  # noqa: E402
    from_single,
    init_state,
    make_logits,
    make_loss_and_grads,
    make_train_step,
)
from jaxhc.train.config import load  # noqa: E402
from tests._gpt import LLAMA, POLICIES, SEED, assert_trees_close, batch, mesh_of  # noqa: E402

VOCAB, T = 97, 16


def perturbed(params, seed: int):
    """Every weight moved off its initial value (norm scales off 1, embeddings off N(0, 0.02))."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return tree.unflatten(
        [
            x + 0.1 * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys, strict=True)
        ]
    )


@pytest.fixture(scope="module")
def flax_model():
    # Flax LLaMA's rotary table needs max_position_embeddings >= 2 x head_dim, and it ignores
    # rope_theta (10000 always): the PyTorch test covers other bases.
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = transformers.FlaxLlamaForCausalLM(config, seed=0)
    model.params = perturbed(model.params, 1)
    return model


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(7).integers(0, VOCAB, (8, T + 1)).astype(np.int32)


@pytest.fixture(scope="module")
def flax_logits(flax_model, inputs):
    return np.asarray(flax_model(inputs[:, :-1]).logits)


def test_config_and_layout(flax_model):
    cfg, params = from_hf(flax_model)
    assert (cfg.arch, cfg.n_head, cfg.kv_heads, cfg.ffn, cfg.tied) == ("llama", 4, 2, 96, False)
    kernel = np.asarray(flax_model.params["model"]["layers"]["1"]["self_attn"]["k_proj"]["kernel"])
    assert kernel.shape == (64, 2 * 16)  # Flax: (in, heads x head_dim)
    c, head, d = 5, 1, 3
    assert params["blocks"]["attn"]["k_proj"]["kernel"][1, c, head, d] == kernel[c, head * 16 + d]
    # The common (PyTorch) form and back, bit for bit.
    again = from_state_dict(cfg, to_state_dict(cfg, params))
    jax.tree.map(np.testing.assert_array_equal, again, params)


def test_logits_on_one_device(flax_model, inputs, flax_logits):
    cfg, params = from_hf(flax_model)
    ours = jax.jit(logits, static_argnums=2)(params, inputs[:, :-1], cfg)
    np.testing.assert_allclose(np.asarray(ours), flax_logits, atol=1e-4, rtol=1e-4)
    bf16 = dataclasses.replace(cfg, dtype="bfloat16")  # bf16 compute: within its resolution
    ours = jax.jit(logits, static_argnums=2)(params, inputs[:, :-1], bf16)
    assert np.abs(np.asarray(ours) - flax_logits).max() < 0.05 * np.abs(flax_logits).max()


def test_logits_and_loss_on_2x2x2_mesh_none_and_mpc(flax_model, inputs, flax_logits):
    """The training path (pipeline, tensor-parallel heads and SwiGLU, ZeRO's reduced gradients)
    against transformers' logits and loss and the reference gradients; mpc gives none's bits."""
    cfg, params = from_hf(flax_model)
    cfg = dataclasses.replace(cfg, block_size=T)  # rotary positions: any context up to the model's
    mesh_cfg, mesh = mesh_of("2x2x2")
    hf_loss = optax.softmax_cross_entropy_with_integer_labels(flax_logits, inputs[:, 1:]).mean()
    _, ref_grads = jax.jit(jax.value_and_grad(gpt.loss), static_argnums=2)(params, inputs, cfg)
    sharded = from_single(params, mesh)
    out = make_logits(cfg, mesh_cfg, mesh, POLICIES["none"])(sharded, inputs[:, :-1])
    np.testing.assert_allclose(np.asarray(out), flax_logits, atol=1e-4, rtol=1e-4)
    runs = {}
    for policy in ("none", "mpc"):
        step = make_loss_and_grads(cfg, mesh_cfg, mesh, POLICIES[policy])
        runs[policy] = jax.device_get(step(sharded, inputs))
    loss, grads = runs["none"]
    np.testing.assert_allclose(loss, hf_loss, rtol=1e-5)
    assert_trees_close(grads, ref_grads, rtol=1e-4, what="grads")
    jax.tree.map(np.testing.assert_array_equal, runs["mpc"], runs["none"])


def test_torch_weights_tied_multi_query_and_rope_theta():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,  # multi-query
        max_position_embeddings=T,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    tokens = np.random.default_rng(3).integers(0, VOCAB, (2, T)).astype(np.int64)
    with torch.no_grad():
        want = model(torch.from_numpy(tokens)).logits.numpy()
    cfg, params = from_hf(model)
    assert (cfg.kv_heads, cfg.tied, cfg.theta) == (1, True, 500.0)
    assert "lm_head" not in params
    got = np.asarray(logits(params, jnp.asarray(tokens, jnp.int32), cfg))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"arch": "neox"}, "model.arch='neox' must be one of gpt2, llama"),
        ({"n_kv_head": 2}, "model.n_kv_head is a key of model.arch=llama, not gpt2"),
        (
            {"arch": "llama", "n_head": 4, "n_kv_head": 3},
            "model.n_head=4 is not divisible by model.n_kv_head=3",
        ),
        ({"arch": "llama", "rope_theta": "big"}, "model.rope_theta='big' must be a number > 1"),
        ({"arch": "llama", "intermediate_size": 0}, "model.intermediate_size=0 must be"),
    ],
)
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        GPTConfig(**{"n_head": 4, "n_embd": 64, **kwargs})


def test_rejects_what_jaxhc_does_not_implement():
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, hidden_act="gelu"
    )
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        from_hf(transformers.FlaxLlamaForCausalLM(config, seed=0, _do_init=False))


def test_export_and_init_folders_round_trip(flax_model, inputs, flax_logits, tmp_path):
    """What jaxhc writes for a LLaMA transformers loads with the same logits, and a run started
    from that folder follows its architecture."""
    cfg, params = from_hf(flax_model)
    save_pretrained(str(tmp_path), cfg, params)
    again_cfg, again = load_pretrained(str(tmp_path))
    assert again_cfg == cfg
    jax.tree.map(np.testing.assert_array_equal, again, params)
    flax = transformers.FlaxLlamaForCausalLM.from_pretrained(tmp_path)
    got = np.asarray(flax(inputs[:, :-1]).logits)
    np.testing.assert_allclose(got, flax_logits, atol=1e-4, rtol=1e-4)
    run = load(None, [f"init=hf:{tmp_path}", f"model.block_size={T}"]).model
    assert (run.arch, run.kv_heads, run.ffn, run.tied, run.block_size) == ("llama", 2, 96, False, T)
    jax.tree.map(np.testing.assert_array_equal, initial_params(run, str(tmp_path)), params)


@functools.cache
def llama_run(params_group: int = 1, steps: int = 6):
    """(losses, the last step's ledger by axis and kind) of `steps` ZeRO AdamW steps of the tiny
    LLaMA on one batch, 2 x 2 x 2, policy none; `params_group` > 1: parameters sharded over that
    many data ranks, gathered layer by layer."""
    mesh_cfg, mesh = mesh_of("2x2x2")
    mesh_cfg = dataclasses.replace(mesh_cfg, shard=ShardConfig(params=params_group))
    optim = OptimConfig(lr=1e-2, warmup_steps=1, total_steps=steps, weight_decay=0.0)
    step = make_train_step(LLAMA, mesh_cfg, optim, mesh, POLICIES["none"])
    state = init_state(LLAMA, mesh_cfg, optim, mesh, SEED)
    losses, ledger = [], jaxhc.accounting.Ledger()
    for i in range(steps):
        with ledger if i == steps - 1 else contextlib.nullcontext():
            state, metrics = step(state, batch(0, LLAMA))
            losses.append(np.asarray(metrics["loss"]))  # blocks: one step in flight
            jax.effects_barrier()
    return np.array(losses), ledger.per_axis(devices=mesh.size, by_kind=True)


@pytest.mark.slow  # CI time: the quick suite checks the 2x2x2 logits and loss above
def test_trains_on_2x2x2_and_the_loss_drops():
    """A tiny LLaMA (grouped-query attention, untied head) through the pipeline, tensor
    parallelism and ZeRO (mpc's bits are none's: see above): the first loss is the reference
    model's, then it drops.
    Its collectives are jaxhc's, as many as GPT-2's: per layer and micro-batch, attention and
    SwiGLU each enter (q, k, v; gate, up) and exit tensor parallelism once; the end stages sum
    the gradients of the head and the final norm (the untied embedding is the first stage's)."""
    losses, ledger = llama_run()
    params = jax.jit(gpt.init_params, static_argnums=0)(LLAMA, SEED)
    want = jax.jit(gpt.loss, static_argnums=2)(params, batch(0, LLAMA), LLAMA)
    np.testing.assert_allclose(losses[0], want, rtol=1e-5)
    assert losses[-1] < losses[0] - 0.5, losses
    layers, micro = LLAMA.n_layer // 2, 2
    calls = {k: v["calls"] for k, v in ledger.items()}
    assert calls == {
        "tensor/act": 2 * 2 * layers * micro,
        "pipe/act": 2 * micro,
        "pipe/grad": 1,
        "data/grad": 1,
        "data/param": 1,
        "data,pipe/other": 1,
        "data,tensor,pipe/other": 1,
    }
    paired = 4 * (LLAMA.vocab_size + 1) * LLAMA.n_embd  # lm_head and ln_f's scale
    assert ledger["pipe/grad"]["raw_bytes"] == 2 / 2 * paired


@pytest.mark.slow
def test_sharded_parameters_give_the_same_losses():
    """ZeRO-3 (the AMSP plan s_p = s_g = s_os = data) gives ZeRO-1's losses bit for bit."""
    zero3, zero1 = llama_run(2)[0], llama_run()[0]
    np.testing.assert_array_equal(zero3.view(np.uint32), zero1.view(np.uint32))
