"""ZeRO-1 AdamW over the "data" axis: reduce-scatter gradients, update a chunk, all-gather params.

Per rank, per step (inside shard_map):

1. `reduce`: its local gradients, flattened (`FlatLayout`), are reduce-scattered over "data" with
   `jaxhc.psum_scatter(kind="grad")`: the rank receives the summed gradient of its chunk;
2. `update`: the global gradient norm sums each chunk's squares over all ranks, counting a
   parameter that is replicated over "tensor" or "pipe" once (on rank 0 of that axis), and clips
   like `optax.clip_by_global_norm`;
3. optax AdamW updates the chunk (its moments and the exact "master" copy of its parameters live
   only on this rank), with per-element weight decay (matrices and embeddings only) and the
   warm-up + cosine learning rate;
4. the updated chunks are all-gathered over "data" with `jaxhc.all_gather(kind="param")`; every
   rank, the owner included, computes with the decoded values, so the replicas stay identical,
   while the next update starts from the master copy, so a lossy param codec does not compound.

`reference_optimizer` is the same update on one device, on the whole parameter tree (the oracle).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

import jaxhc
from jaxhc.model.config import OptimConfig
from jaxhc.parallel.layout import FlatLayout, decay_mask

ALL_AXES = ("data", "tensor", "pipe")


def lr_schedule(cfg: OptimConfig):
    """Linear warm-up to ``lr`` over ``warmup_steps``, cosine decay to ``lr * min_lr_ratio`` at
    ``total_steps``, constant after (nanoGPT's schedule: step 0 already has a non-zero rate)."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = peak * (step + 1) / (cfg.warmup_steps + 1)
        ratio = jnp.clip(
            (step - cfg.warmup_steps) / max(cfg.total_steps - cfg.warmup_steps, 1), 0, 1
        )
        cosine = floor + 0.5 * (1 + jnp.cos(jnp.pi * ratio)) * (peak - floor)
        return jnp.where(step < cfg.warmup_steps, warm, cosine)

    return schedule


def adamw(cfg: OptimConfig, learning_rate, weight_decay, mask=None) -> optax.GradientTransformation:
    return optax.adamw(learning_rate, cfg.b1, cfg.b2, cfg.eps, weight_decay=weight_decay, mask=mask)


def reference_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """The single-device equivalent of `update`, for whole parameter trees."""
    clip = optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity()
    return optax.chain(clip, adamw(cfg, lr_schedule(cfg), cfg.weight_decay, mask=decay_mask))


def init_chunk(cfg: OptimConfig, chunk: jax.Array) -> dict:
    """Optimizer state of one rank's chunk: AdamW's (the decay and learning rate do not enter it)
    and the exact "master" copy of the chunk's parameters (taken from the parameters at step 0)."""
    return {
        "adam": adamw(cfg, cfg.lr, cfg.weight_decay).init(chunk),
        "master": jnp.zeros_like(chunk),
    }


def reduce_gradients(grads, layout: FlatLayout, policy, residual=None):
    """This rank's chunk of the flattened gradients, summed over "data".

    With `residual` (error feedback: this device's padded flat vector), (chunk, new residual).
    """
    flat = layout.flatten(grads)
    if jaxhc.axis_size("data") == 1:
        return flat if residual is None else (flat, residual)
    return jaxhc.psum_scatter(
        flat, "data", tiled=True, policy=policy, kind="grad", residual=residual
    )


def chunk_start(layout: FlatLayout) -> jax.Array:
    return jaxhc.axis_index("data") * layout.chunk


def global_norm(chunk: jax.Array, layout: FlatLayout) -> jax.Array:
    """L2 norm of the whole model's gradient from every rank's reduced chunk."""
    owned = layout.owned(jaxhc.axis_index("tensor"), jaxhc.axis_index("pipe"))
    mine = layout.per_element(owned, chunk_start(layout), layout.chunk)
    return jnp.sqrt(psum_scalar(jnp.sum(jnp.where(mine, jnp.square(chunk), 0.0)), ALL_AXES))


def psum_scalar(x: jax.Array, axes) -> jax.Array:
    """Plain (uncompressed) sum of a scalar (or a few values) over `axes`, through jaxhc so the
    ledger sees it: gathered, then added in rank order, one rank at a time. An all-reduce would
    sum in an order of its own choosing, which differs between one process (XLA:CPU) and several
    (gloo), so the same run would not give the same bits in both."""
    axes = tuple(a for a in axes if jaxhc.axis_size(a) > 1)
    if not axes:
        return x
    parts = jaxhc.all_gather(x, axes, to="invarying")
    total = parts[0]
    for i in range(1, parts.shape[0]):
        total = total + parts[i]
    return total


def reduce(grads, opt_state, layout: FlatLayout, policy):
    """(this rank's chunk of the gradients summed over "data", opt_state). Runs per shard.

    An ``opt_state["residual"]`` (error feedback) goes into the reduction and comes back updated.
    """
    residual = opt_state.get("residual")
    if residual is None:
        return reduce_gradients(grads, layout, policy), opt_state
    g, residual = reduce_gradients(grads, layout, policy, residual)
    return g, {**opt_state, "residual": residual}


def update(params, opt_state, g, step, layout: FlatLayout, cfg: OptimConfig, policy, before=None):
    """One ZeRO-1 AdamW step on the reduced chunk `g` of `reduce`: (new params, new opt_state,
    grad_norm, lr). Runs per shard.

    A step whose gradient norm is not finite (NaN/Inf on any rank reaches every rank's norm, so all
    ranks agree) is skipped: parameters, moments, master copy and residual stay as they were in
    `before` (the opt_state given to `reduce`; default `opt_state`). The lossy codecs' agreed
    fallback kept the NaN off their encoders."""
    norm = global_norm(g, layout)
    finite = jnp.isfinite(norm)
    if cfg.grad_clip > 0:  # the same expression as optax.clip_by_global_norm
        g = jnp.where(norm < cfg.grad_clip, g, g / norm * cfg.grad_clip)
    start = chunk_start(layout)
    # The update starts from this rank's exact master copy, not from the gathered parameters: those
    # are the param codec's decoded values, and a lossy codec would re-quantize them every step.
    gathered = lax.dynamic_slice_in_dim(layout.flatten(params), start, layout.chunk)
    p = jnp.where(step == 0, gathered, opt_state["master"])
    decay = cfg.weight_decay * layout.per_element([*layout.decayed, False], start, layout.chunk)
    lr = lr_schedule(cfg)(step)
    updates, adam = adamw(cfg, lr, decay).update(g, opt_state["adam"], p)
    kept = {**(opt_state if before is None else before), "master": p}
    new = {**opt_state, "adam": adam, "master": optax.apply_updates(p, updates)}
    opt_state = jax.tree.map(lambda n, w: jnp.where(finite, n, w), new, kept)
    p = opt_state["master"]
    if jaxhc.axis_size("data") > 1:
        p = jaxhc.all_gather(p, "data", tiled=True, policy=policy, kind="param")
    return layout.unflatten(p), opt_state, norm, lr
