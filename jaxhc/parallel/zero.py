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

The collectives are compressed by the policy of `jaxhc.context` (the train step traces under it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax import lax

import jaxhc
from jaxhc import context
from jaxhc.collectives import resolve_codec
from jaxhc.model.config import OptimConfig
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layout import FlatLayout, per_value


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


def init_chunk(cfg: OptimConfig, chunk: jax.Array) -> dict:
    """Optimizer state of one rank's chunk of parameter values: AdamW's (the decay and learning
    rate do not enter it) and the exact "master" copy of the chunk, which every update starts
    from."""
    return {"adam": adamw(cfg, cfg.lr, cfg.weight_decay).init(chunk), "master": chunk}


def all_axes(shard: ShardPlan | None) -> tuple[str, ...]:
    """Every mesh axis the step runs over: the data (sub-)axes, "tensor", "pipe"."""
    return (*(shard.axes if shard else ("data",)), "tensor", "pipe")


def levels(shard: ShardPlan | None) -> list[tuple[str, int]]:
    """The data levels a gradient reduce-scatter runs over, innermost first: (axis, size), size
    > 1 (`shard` None: the whole "data" axis, inside a shard_map)."""
    if shard is None:
        return [("data", n)] if (n := jaxhc.axis_size("data")) > 1 else []
    return [
        (a, n) for a, n in zip(reversed(shard.axes), reversed(shard.sizes), strict=True) if n > 1
    ]


def residual_sizes(padded: int, shard: ShardPlan) -> list[int]:
    """Error feedback: the length of each level's residual (`levels` order), the vector that
    level's reduce-scatter sends (the padded vector, then 1/its inner ranks of it, ...)."""
    return level_residuals(padded, [size for _, size in levels(shard)])


def level_residuals(padded: int, sizes) -> list[int]:
    """The residual lengths of `residual_sizes` for data levels of `sizes` ranks, innermost first
    (a level of one rank sends nothing and keeps none): what the planner counts too."""
    out, n = [], padded
    for size in sizes:
        if size > 1:
            out.append(n)
            n //= size
    return out


def split_residual(residual, padded: int, shard: ShardPlan) -> list:
    """A device's residual vector (the levels' residuals one after the other) as per level."""
    out, at = [], 0
    for n in residual_sizes(padded, shard):
        out.append(residual[at : at + n])
        at += n
    return out


def scatter_levels(flat, steps, residuals=None, codecs=None):
    """Reduce-scatter `flat` over each (axis, size) of `steps` in turn (``kind="grad"``); with
    `residuals` (one per step, error feedback), (flat, new residuals). `codecs` (one per step):
    the codec each call compresses with (None: the policy's choice for `flat` itself)."""
    new, policy = [], context.policy()
    for i, (axis, size) in enumerate(steps):
        codec = None if codecs is None else codecs[i]
        if residuals is None:
            flat = jaxhc.psum_scatter(flat, axis, tiled=True, kind="grad", codec=codec)
        elif policy is not None and policy.keep_own(axis):
            flat, r = _scatter_keeping_own(flat, axis, size, codec, residuals[i])
            new.append(r)
        else:
            flat, r = jaxhc.psum_scatter(
                flat, axis, tiled=True, kind="grad", codec=codec, residual=residuals[i]
            )
            new.append(r)
    return flat if residuals is None else (flat, new)


def _scatter_keeping_own(flat, axis, size, codec, residual):
    """Error feedback with ``keep_own``: the rank's own slice of ``flat + residual`` never
    travels, so it is sent as zeros (which every lossy codec codes exactly) and added uncoded to
    the reduced slice; only the slices sent to the other ranks are coded and leave residuals."""
    n = flat.shape[0] // size
    at = jaxhc.axis_index(axis) * n
    own = lax.dynamic_slice_in_dim(flat, at, n) + lax.dynamic_slice_in_dim(residual, at, n)
    zeros = jnp.zeros((n,), flat.dtype)
    flat = lax.dynamic_update_slice_in_dim(flat, zeros, at, 0)
    residual = lax.dynamic_update_slice_in_dim(residual, zeros.astype(residual.dtype), at, 0)
    out, r = jaxhc.psum_scatter(flat, axis, tiled=True, kind="grad", codec=codec, residual=residual)
    return out + own, lax.dynamic_update_slice_in_dim(r, zeros.astype(r.dtype), at, 0)


def whole_codecs(layout: FlatLayout, shard: ShardPlan | None, dtype=jnp.float32) -> dict:
    """The codec the whole flat vector's reduction (`reduce_gradients`) gets on each call, by
    (axis, "scatter" | "gather"): a segment reduced on its own is sent the same way (the
    policy's ``min_bytes`` would otherwise see a smaller message), so its bits are the same."""
    keep = ("data",) if shard is None else shard.grad_axes
    steps, n, out = levels(shard), layout.padded, {}
    for axis, size in steps:
        like = jax.ShapeDtypeStruct((n,), dtype)
        out[axis, "scatter"] = resolve_codec(like, axis, None, None, "grad")
        n //= size
    for axis, size in reversed(steps):
        if axis not in keep:
            like = jax.ShapeDtypeStruct((n,), dtype)
            out[axis, "gather"] = resolve_codec(like, axis, None, None, "grad")
            n *= size
    return out


def reduce_gradients(
    grads, layout: FlatLayout, residual=None, shard=None, scattered=0, codecs=None
):
    """This rank's chunk of the flattened gradients, summed over the data axis: its share of the
    plan's gradient group (`shard`; None: the whole "data" axis, ZeRO). Reduce-scattered level by
    level, innermost first, then all-gathered back over the levels outside the gradient group,
    outermost first (a hierarchical all-reduce there: each level moves 1/its inner ranks of the
    vector).

    `grads`: the parameter tree, or flat (the whole vector, or a segment of it: its pieces split
    over the levels as the vector's do). `scattered`: how many levels (innermost first) it has
    already been reduce-scattered over (sharded parameters, `gather_params`). With `residual`
    (error feedback: the residuals of the levels still to do, one list entry each), (chunk, new
    residuals). `codecs`: `whole_codecs`, for a segment sent as the whole vector would be.
    """
    flat = layout.flatten(grads) if isinstance(grads, dict) else grads
    keep = ("data",) if shard is None else shard.grad_axes
    steps = levels(shard)[scattered:]
    chosen = None if codecs is None else [codecs[a, "scatter"] for a, _ in steps]
    out = scatter_levels(flat, steps, residual, chosen)
    flat = out if residual is None else out[0]
    for axis, _ in reversed(levels(shard)):  # outermost first
        if axis not in keep:
            codec = None if codecs is None else codecs[axis, "gather"]
            flat = jaxhc.all_gather(flat, axis, tiled=True, kind="grad", codec=codec)
    return flat if residual is None else (flat, out[1])


def gather_chunk(chunk, shard: ShardPlan):
    """A flat parameter chunk (or a layer's piece of it) all-gathered over the parameter group,
    outermost sub-axis first (``kind="param"``)."""
    for axis in shard.param_axes:
        chunk = jaxhc.all_gather(chunk, axis, tiled=True, kind="param")
    return chunk


def gather_params(unflatten, flatten, shard: ShardPlan, choose=None):
    """Sharded parameters (s_p > 1): ``gather(chunk, residuals) -> parameter tree``, the
    device's 1/s_p chunk of a flat vector all-gathered over the parameter group, outermost
    sub-axis first (``kind="param"``), and `unflatten`ed. Its reverse mode is the gradients'
    reduce-scatter over the same levels, innermost first (``kind="grad"``): the cotangent tree
    is `flatten`ed (after the end stages' sum of the shared embeddings' gradients) and
    scattered, so the chunk's gradient is the partial sum `reduce_gradients(..., scattered=)`
    continues. `residuals` (error feedback: the parameter levels' residuals, or ()) come back as
    their own cotangent: the new residuals.

    The gathered parameters are not a residual of this function (its backward needs none of
    them): the device holds them once, for the forward and as the model's own autodiff
    residuals, and frees them after the backward. With ``mesh.shard.gather: whole`` this
    gathers the whole local vector; per layer it gathers the shared parameters (`layer_fetch`
    gathers the layers'). `choose(fn, chunk)` runs the gather (`keep.first_gathers`; None:
    ``fn(chunk)``).
    """
    param_steps = levels(shard)[: len(shard.param_axes)]
    whole = functools.partial(gather_chunk, shard=shard)

    @jax.custom_vjp
    def gather(chunk, residuals):
        return unflatten(whole(chunk) if choose is None else choose(whole, chunk))

    def fwd(chunk, residuals):
        return gather(chunk, residuals), residuals

    def bwd(residuals, ct):
        flat = flatten(ct)
        if not residuals:
            return scatter_levels(flat, param_steps), residuals
        g, new = scatter_levels(flat, param_steps, list(residuals))
        return g, tuple(new)

    gather.defvjp(fwd, bwd)
    return gather


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
    `start`); the same sum in the same order for every plan on the same data levels. Squares
    are summed per row of the layout first (a row is one parameter's), so the ownership mask
    applies to the row sums: one pass over the chunk."""
    owned = layout.owned_rows(
        jaxhc.axis_index("tensor"), jaxhc.axis_index("pipe"), start, layout.chunk
    )
    rows = jnp.sum(jnp.square(chunk).reshape(owned.shape[0], -1), axis=1)
    return jnp.sqrt(psum_scalar(jnp.sum(jnp.where(owned, rows, 0.0)), axes))


def psum_scalar(x: jax.Array, axes) -> jax.Array:
    """Plain (uncompressed) sum of a scalar (or a few values) over `axes`, through jaxhc so the
    ledger sees it: gathered, then added in rank order, one rank at a time. An all-reduce would
    sum in an order of its own choosing, which differs between one process (XLA:CPU) and several
    (gloo), so the same run would not give the same bits in both."""
    axes = tuple(a for a in axes if jaxhc.axis_size(a) > 1)
    if not axes:
        return x
    with context.use(policy=None):  # plain, whatever the step's policy
        parts = jaxhc.all_gather(x, axes, to="invarying")
    total = parts[0]
    for i in range(1, parts.shape[0]):
        total = total + parts[i]
    return total


def reduce(grads, opt_state, layout: FlatLayout, shard: ShardPlan, scattered=0, done=()):
    """(this rank's chunk of the gradients summed over the data axis, opt_state). Per shard.

    An ``opt_state["residual"]`` (error feedback: the residuals of every level, innermost first,
    one after the other) goes into the reduction and comes back updated. `scattered`: levels
    `grads` is already reduced over (sharded parameters; `done`: their new residuals).
    """
    residual = opt_state.get("residual")
    if residual is None:
        g = reduce_gradients(grads, layout, shard=shard, scattered=scattered)
        return g, opt_state
    parts = split_residual(residual, layout.padded, shard)[scattered:]
    g, new = reduce_gradients(grads, layout, parts, shard, scattered)
    residual = unpadded_residual(jnp.concatenate([*done, *new]), layout, shard)
    return g, {**opt_state, "residual": residual}


def unpadded_residual(residual, layout: FlatLayout, shard: ShardPlan):
    """A device's residuals (every level's, `split_residual`) with the padding of the flat
    vector set to zero: a codec that mixes a block's values (q4:h, q8:h) leaves residuals there
    too, which the checkpoint does not store, so a resumed run would start without them. They
    only ever correct padding: the real values' residuals are as they were."""
    out, done = [], ()  # the levels scattered before: innermost last
    parts = split_residual(residual, layout.padded, shard)
    for (axis, _), part in zip(levels(shard), parts, strict=True):
        n = part.shape[0]
        out.append(jnp.where(layout.stored(shard.chunk_index(done) * n, n), part, 0.0))
        done = (axis, *done)
    return jnp.concatenate(out)


def update(
    opt_state, g, step, layout: FlatLayout, cfg: OptimConfig, shard, before=None, previous=None
):
    """One AdamW step on the reduced chunk `g` of `reduce`: (new params, new opt_state,
    grad_norm, lr). Per shard: the rank updates its optimizer-state chunk (a slice of `g`), and
    the chunks are all-gathered over the optimizer-state group, outermost sub-axis first; with
    sharded parameters (s_p > 1) only over the sub-axes outside the parameter group: the result
    is then the rank's flat parameter chunk, else the parameter tree.

    The update starts from the rank's exact master copy, not from the gathered parameters: those
    are the param codec's decoded values, and a lossy codec would re-quantize them every step.

    A step whose gradient norm is not finite (NaN/Inf on any rank reaches every rank's norm, so all
    ranks agree) is skipped: parameters, moments, master copy and residual stay as they were in
    `before` (the opt_state given to `reduce`; default `opt_state`). The lossy codecs' agreed
    fallback kept the NaN off their encoders.

    `previous` (the policy's ``param_delta``; unsharded parameters): the parameter tree the ranks
    computed with this step, identical on every rank. Each rank then sends the change of its
    chunk since that copy (its master chunk minus the copy's chunk) and every rank adds the
    gathered, decoded changes to its copy: the same values everywhere, and what the param codec
    loses of one change is part of the next one, so the copy stays within one change's coding
    error of the master copy instead of the coding error of the parameters themselves."""
    norm = global_norm(*finest(g, layout, shard), layout, all_axes(shard))
    finite = jnp.isfinite(norm)
    size = layout.padded // shard.optim
    start = shard.chunk_index(shard.optim_axes) * size
    g = lax.dynamic_slice_in_dim(g, start - shard.chunk_index(shard.grad_axes) * g.shape[0], size)
    lr = lr_schedule(cfg)(step)

    def apply(state, g):  # (the per-value decay is computed in here, where XLA fuses it)
        decay = cfg.weight_decay * per_value(layout.rows(layout.decayed, start, size))
        # a lossy codec's values in the padding: the moments and master copy keep zeros there
        g = jnp.where(layout.stored(start, size), g, 0.0)
        if cfg.grad_clip > 0:  # optax.clip_by_global_norm, as one factor for all values
            g = g * jnp.where(norm < cfg.grad_clip, 1.0, cfg.grad_clip / norm)
        p = state["master"]
        updates, adam = adamw(cfg, lr, decay).update(g, state["adam"], p)
        return {**state, "adam": adam, "master": optax.apply_updates(p, updates)}

    # A branch, not a select per value: XLA then updates the state in place (selecting between
    # the old and the new moments reads the old ones after the new are written, so XLA copied
    # the whole state first: 4x the update's time).
    kept = opt_state if before is None else before
    opt_state = lax.cond(finite, apply, lambda *_: kept, opt_state, g)
    p = opt_state["master"]
    axes = [a for a in shard.optim_axes if a not in shard.param_axes and jaxhc.axis_size(a) > 1]
    if previous is not None and axes:
        copy = layout.flatten(previous)
        p = p - lax.dynamic_slice_in_dim(copy, start, size)
    for axis in axes:  # up to the parameter chunk (its axes are the inner ones)
        p = jaxhc.all_gather(p, axis, tiled=True, kind="param")
    if previous is not None and axes:
        p = copy + p
    if shard.sharded_params and axes:  # the state's chunk: no decoded values in the padding
        n = p.shape[0]
        p = jnp.where(layout.stored(shard.chunk_index(shard.param_axes) * n, n), p, 0.0)
    return (p if shard.sharded_params else layout.unflatten(p)), opt_state, norm, lr
