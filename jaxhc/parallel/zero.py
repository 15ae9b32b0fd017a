"""Sharded AdamW over the "data" axis: reduce gradients, update a chunk, all-gather params.

Per rank, per step (inside shard_map), for a plan of `jaxhc.parallel.amsp` (ZeRO by default:
gradients and optimizer state split over the whole data axis):

1. `reduce`: its local gradients, flattened (`FlatLayout`), are reduce-scattered over the data
   axis and all-gathered back over the levels outside the plan's gradient group
   (`jaxhc.psum_scatter` / `jaxhc.all_gather`, ``kind="grad"``): the rank receives the summed
   gradient of its gradient chunk;
2. `update`: the global gradient norm sums each rank's finest chunk's squares over all ranks,
   counting a parameter that is replicated over "tensor" or "pipe" once (on rank 0 of that
   axis), and clips like `optax.clip_by_global_norm`;
3. optax AdamW updates the rank's optimizer-state chunk (a slice of its gradient chunk; its
   moments and the exact "master" copy of its parameters live on the ranks of its group's
   replicas only), with per-element weight decay (matrices and embeddings only) and the
   warm-up + cosine learning rate;
4. the updated chunks are all-gathered over the optimizer-state group with
   `jaxhc.all_gather(kind="param")`; every rank, the owner included, computes with the decoded
   values, so the replicas stay identical, while the next update starts from the master copy, so
   a lossy param codec does not compound.

`reference_optimizer` is the same update on one device, on the whole parameter tree (the oracle).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

import jaxhc
from jaxhc.model.config import OptimConfig
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layout import FlatLayout, decay_mask


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


def all_axes(shard: ShardPlan | None) -> tuple[str, ...]:
    """Every mesh axis the step runs over: the data (sub-)axes, "tensor", "pipe"."""
    return (*(shard.axes if shard else ("data",)), "tensor", "pipe")


def reduce_gradients(grads, layout: FlatLayout, policy, residual=None, shard=None):
    """This rank's chunk of the flattened gradients, summed over the data axis: its share of the
    plan's gradient group (`shard`; None: the whole "data" axis, ZeRO). Reduce-scattered level by
    level, innermost first, then all-gathered back over the levels outside the gradient group,
    outermost first (a hierarchical all-reduce there: each level moves 1/its inner ranks of the
    vector).

    With `residual` (error feedback: this device's padded flat vector), (chunk, new residual);
    only where the data axis is one level.
    """
    flat = layout.flatten(grads)
    axes, keep = (("data",), ("data",)) if shard is None else (shard.axes, shard.grad_axes)
    if residual is not None and len(axes) > 1:
        raise ValueError("error feedback needs a one-level data axis (mesh.shard.groups)")
    for axis in reversed(axes):
        if jaxhc.axis_size(axis) == 1:
            continue
        if residual is None:
            flat = jaxhc.psum_scatter(flat, axis, tiled=True, policy=policy, kind="grad")
        else:
            flat, residual = jaxhc.psum_scatter(
                flat, axis, tiled=True, policy=policy, kind="grad", residual=residual
            )
    for axis in axes:
        if axis not in keep and jaxhc.axis_size(axis) > 1:
            flat = jaxhc.all_gather(flat, axis, tiled=True, policy=policy, kind="grad")
    return flat if residual is None else (flat, residual)


def chunk_start(layout: FlatLayout, shard: ShardPlan | None = None) -> jax.Array:
    """Where this rank's finest chunk (1/data of the flat vector) starts: the chunk a full
    reduce-scatter over the data axis would leave it (it holds that chunk in every plan)."""
    if shard is None:
        return jaxhc.axis_index("data") * layout.chunk
    return shard.chunk_index(shard.axes) * layout.chunk


def finest(g: jax.Array, layout: FlatLayout, shard: ShardPlan):
    """(this rank's finest chunk of its reduced gradient chunk `g`, where it starts)."""
    start = chunk_start(layout, shard)
    offset = start - shard.chunk_index(shard.grad_axes) * g.shape[0]
    return lax.dynamic_slice_in_dim(g, offset, layout.chunk), start


def global_norm(chunk: jax.Array, start, layout: FlatLayout, axes) -> jax.Array:
    """L2 norm of the whole model's gradient from every rank's finest chunk (which starts at
    `start`); the same sum in the same order for every plan on the same data levels."""
    owned = layout.owned(jaxhc.axis_index("tensor"), jaxhc.axis_index("pipe"))
    mine = layout.per_element(owned, start, layout.chunk)
    return jnp.sqrt(psum_scalar(jnp.sum(jnp.where(mine, jnp.square(chunk), 0.0)), axes))


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


def reduce(grads, opt_state, layout: FlatLayout, policy, shard: ShardPlan):
    """(this rank's chunk of the gradients summed over the data axis, opt_state). Per shard.

    An ``opt_state["residual"]`` (error feedback) goes into the reduction and comes back updated.
    """
    residual = opt_state.get("residual")
    if residual is None:
        return reduce_gradients(grads, layout, policy, shard=shard), opt_state
    g, residual = reduce_gradients(grads, layout, policy, residual, shard)
    return g, {**opt_state, "residual": residual}


def update(
    params, opt_state, g, step, layout: FlatLayout, cfg: OptimConfig, policy, shard, before=None
):
    """One AdamW step on the reduced chunk `g` of `reduce`: (new params, new opt_state,
    grad_norm, lr). Per shard: the rank updates its optimizer-state chunk (a slice of `g`), and
    the chunks are all-gathered over the optimizer-state group, outermost sub-axis first.

    A step whose gradient norm is not finite (NaN/Inf on any rank reaches every rank's norm, so all
    ranks agree) is skipped: parameters, moments, master copy and residual stay as they were in
    `before` (the opt_state given to `reduce`; default `opt_state`). The lossy codecs' agreed
    fallback kept the NaN off their encoders."""
    norm = global_norm(*finest(g, layout, shard), layout, all_axes(shard))
    finite = jnp.isfinite(norm)
    size = layout.padded // shard.optim
    start = shard.chunk_index(shard.optim_axes) * size
    g = lax.dynamic_slice_in_dim(g, start - shard.chunk_index(shard.grad_axes) * g.shape[0], size)
    if cfg.grad_clip > 0:  # the same expression as optax.clip_by_global_norm
        g = jnp.where(norm < cfg.grad_clip, g, g / norm * cfg.grad_clip)
    # The update starts from this rank's exact master copy, not from the gathered parameters: those
    # are the param codec's decoded values, and a lossy codec would re-quantize them every step.
    gathered = lax.dynamic_slice_in_dim(layout.flatten(params), start, size)
    p = jnp.where(step == 0, gathered, opt_state["master"])
    decay = cfg.weight_decay * layout.per_element([*layout.decayed, False], start, size)
    lr = lr_schedule(cfg)(step)
    updates, adam = adamw(cfg, lr, decay).update(g, opt_state["adam"], p)
    kept = {**(opt_state if before is None else before), "master": p}
    new = {**opt_state, "adam": adam, "master": optax.apply_updates(p, updates)}
    opt_state = jax.tree.map(lambda n, w: jnp.where(finite, n, w), new, kept)
    p = opt_state["master"]
    for axis in shard.optim_axes:
        if jaxhc.axis_size(axis) > 1:
            p = jaxhc.all_gather(p, axis, tiled=True, policy=policy, kind="param")
    return layout.unflatten(p), opt_state, norm, lr
