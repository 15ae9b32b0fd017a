"""Shared setup of the model tests: a tiny GPT, the meshes, policies and cached runs."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import optax

import jaxhc
from jaxhc.model import GPTConfig, MeshConfig, OptimConfig, gpt
from jaxhc.parallel import init_state, make_mesh, make_train_step, params_to_single, zero
from jaxhc.parallel.layout import decay_mask

SEED = 0
BATCH = 8
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_embd=32)
# A tiny LLaMA: grouped-query attention (2 key/value heads for 4), an untied head.
LLAMA = GPTConfig(
    arch="llama",
    vocab_size=64,
    block_size=16,
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    n_embd=64,
    intermediate_size=96,
)
# Clipping triggers (grad norm ~1.2) and the rate changes between the two steps the tests run.
# Adam's first steps are ~lr * sign(g): with a tiny eps, gradients that are zero up to rounding
# (the key bias's, exactly zero in exact arithmetic) flip sign with the summation order and move
# parameters by +-lr. eps=1e-3 keeps the update a smooth function of the gradient.
OPTIM = OptimConfig(
    lr=1e-2, eps=1e-3, weight_decay=0.1, warmup_steps=1, total_steps=4, grad_clip=1.0
)

MESHES = {  # name: (data, tensor, pipe, microbatches)
    "1x1x1": MeshConfig(1, 1, 1, 1),
    "2x2x2": MeshConfig(2, 2, 2, 2),
    "1x2x4": MeshConfig(1, 2, 4, 4),
    "4x2x1": MeshConfig(4, 2, 1, 2),
    "2x1x4": MeshConfig(2, 1, 4, 2),
}


def all_axes(codec: str, name: str) -> jaxhc.Policy:
    """`codec` on every axis, compressing every message (the tiny model's are under 64 KiB)."""
    axes = {axis: codec for axis in ("data", "tensor", "pipe")}
    return jaxhc.Policy.from_dict({"name": name, "axes": axes, "min_bytes": 0})


POLICIES = {
    "none": jaxhc.Policy.preset("none"),
    "identity": all_axes("none", "identity-all"),
    # The preset's budget: messages that do not fit fall back to raw transfer.
    "mpc": all_axes(f"mpc:{jaxhc.policy.MPC_BUDGET}", "mpc-all"),
    "mpc-unbudgeted": all_axes("mpc", "mpc-unbudgeted"),  # every call compressed
    "zhybrid": jaxhc.Policy.from_dict(
        {
            "name": "zhybrid-all",
            "axes": {"data": "zfp:8", "tensor": "zfp:16", "pipe": "zfp:16"},
            "min_bytes": 0,
        }
    ),
}


def mesh_of(name: str):
    cfg = MESHES[name]
    return cfg, make_mesh(cfg, jax.devices()[: cfg.size])


def batch(i: int, cfg: GPTConfig = CFG, size: int = BATCH) -> np.ndarray:
    rng = np.random.default_rng(1000 + i)
    return rng.integers(0, cfg.vocab_size, (size, cfg.block_size + 1)).astype(np.int32)


@functools.cache
def train_step(mesh_name: str, policy: str, dtype: str):
    """(model config, mesh config, mesh, jitted train step), one compilation per combination."""
    cfg = dataclasses.replace(CFG, dtype=dtype)
    mesh_cfg, mesh = mesh_of(mesh_name)
    return cfg, mesh_cfg, mesh, make_train_step(cfg, mesh_cfg, OPTIM, mesh, POLICIES[policy])


@functools.cache
def parallel_run(mesh_name: str, policy: str, steps: int = 2, dtype: str = "float32"):
    """(initial params, per-step metrics, final params) of `steps` train steps, on the host."""
    cfg, mesh_cfg, mesh, step = train_step(mesh_name, policy, dtype)
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    initial = params_to_single(state)
    metrics = []
    for i in range(steps):
        state, m = step(state, batch(i))
        metrics.append({k: np.asarray(v) for k, v in m.items()})  # blocks: one step in flight
    return initial, metrics, params_to_single(state)


def reference_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """The single-device equivalent of jaxhc's sharded update, for whole parameter trees: optax's
    global-norm clip and AdamW with the decay mask (matrices and embeddings) and the schedule."""
    clip = optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity()
    adamw = optax.adamw(
        zero.lr_schedule(cfg),
        cfg.b1,
        cfg.b2,
        cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    return optax.chain(clip, adamw)


@functools.cache
def reference_run(steps: int = 2):
    """The same run on one device with the reference model and optimizer."""
    tx = reference_optimizer(OPTIM)

    @jax.jit
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(gpt.loss)(params, tokens, CFG)
        updates, opt_state = tx.update(grads, opt_state, params)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
        return optax.apply_updates(params, updates), opt_state, metrics

    params = jax.jit(gpt.init_params, static_argnums=0)(CFG, SEED)
    initial, opt_state, metrics = jax.device_get(params), tx.init(params), []
    for i in range(steps):
        params, opt_state, m = step(params, opt_state, batch(i))
        metrics.append({k: np.asarray(v) for k, v in m.items()})
    return initial, metrics, jax.device_get(params)


@functools.cache
def reference_grads(dtype: str = "float32"):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    params = jax.jit(gpt.init_params, static_argnums=0)(cfg, SEED)
    loss, grads = jax.jit(jax.value_and_grad(gpt.loss), static_argnums=2)(params, batch(0), cfg)
    return float(loss), jax.device_get(grads)


def assert_trees_close(actual, expected, rtol: float, what: str = "", base=None) -> None:
    """Leaf by leaf: |actual - expected| <= rtol * max|expected| (relative to the leaf's scale).

    With `base` (the tree `actual` and `expected` are changes of, computed in float32), each leaf
    also gets the float32 resolution of `base`'s values as slack.
    """
    flat = jax.tree.flatten_with_path(expected)[0]
    bases = jax.tree.leaves(base) if base is not None else [0.0] * len(flat)
    for (path, want), got, b in zip(flat, jax.tree.leaves(actual), bases, strict=True):
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        scale = max(np.abs(want).max(), 1e-30)
        slack = 2 * np.spacing(np.abs(np.asarray(b, np.float32)).max())
        err = np.abs(got - want).max()
        assert err <= rtol * scale + slack, (
            f"{what}{jax.tree_util.keystr(path)}: relative error {err / scale:.3g} > {rtol}"
        )


def assert_trees_equal(a, b) -> None:
    """The same tree structure and every leaf equal, bit for bit."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def step_losses(runner, state, batches, steps):
    """`runner`'s train step over `batches.train(i)` for i in `steps`: (state, each loss's float32
    bits)."""
    out = []
    for i in steps:
        state, m = runner.step(state, batches.train(i))
        out.append(np.float32(m["loss"]).view(np.uint32))
    return state, out
