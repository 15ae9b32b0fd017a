"""Per-shard loss and gradients of the GPT on a ("data", "tensor", "pipe") mesh: the pipelined
forward, this rank's share of the loss, and its gradients, reduced over "data" in the backward
(`overlapped_loss_and_grads`), in the parameter gathers' backward (`sharded_loss_and_grads`) or
left to the step (`local_loss_and_grads`). `jaxhc.parallel.step` builds the programs from them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

import jaxhc
from jaxhc import context
from jaxhc._compat import axis_tuple
from jaxhc.collectives import started
from jaxhc.model import gpt
from jaxhc.model.config import GPTConfig, MeshConfig
from jaxhc.model.tensor_parallel import TensorParallel
from jaxhc.parallel import keep, prefetch, zero
from jaxhc.parallel.layers import layer_reduce, scatter_layers
from jaxhc.parallel.layout import PAIRED
from jaxhc.parallel.pipeline import gpipe
from jaxhc.parallel.state import Plan

__all__ = [
    "forward",
    "local_loss",
    "local_loss_and_grads",
    "loss_and_grads",
    "can_overlap",
    "keeps_own",
    "overlapped_loss_and_grads",
    "overlaps",
    "paired",
    "pairs",
    "sharded_loss_and_grads",
    "sum_shared",
]


def forward(params, inputs, cfg: GPTConfig, mesh_cfg: MeshConfig, last_stage_fn, fetch=None):
    """Run the pipelined model on this rank's `inputs` (B_local, T) and return
    ``last_stage_fn(hidden)`` on the last stage, zeros elsewhere; hidden is (M, B_local / M, T, C).
    `fetch`: how the blocks get their parameters from ``params["blocks"]`` (`gpt.run_blocks`).
    """
    tp = TensorParallel(mesh_cfg.tensor)
    stage, stages = jaxhc.axis_index("pipe"), jaxhc.axis_size("pipe")
    micro = inputs.reshape(mesh_cfg.microbatches, -1, inputs.shape[-1])
    x = lax.cond(
        stage == 0,
        lambda: gpt.embed(params, micro, cfg),
        lambda: jnp.zeros((*micro.shape, cfg.n_embd), cfg.compute_dtype),
    )
    hidden = gpipe(lambda h: gpt.run_blocks(params["blocks"], h, cfg, tp, fetch), x)
    out = jax.eval_shape(last_stage_fn, hidden)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out)
    return lax.cond(stage == stages - 1, last_stage_fn, lambda _: zeros, hidden)


def local_loss(params, tokens, cfg, mesh_cfg, data="data", fetch=None):
    """This rank's share of the global mean loss: the sum of its token losses over all tokens.
    `data`: the data axis (a name or the sub-axes of `jaxhc.parallel.amsp`); `fetch`: see
    `forward`."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    total = tokens.shape[0] * jaxhc.axis_size(data) * targets.shape[1]

    def loss_sum(hidden):
        logits = gpt.head(params, hidden, cfg)
        return gpt.token_losses(logits, targets.reshape(hidden.shape[:-1])).sum() / total

    return forward(params, inputs, cfg, mesh_cfg, loss_sum, fetch)


def local_loss_and_grads(params, tokens, cfg, mesh_cfg, data="data"):
    """Global loss (every rank) and this rank's gradients of its own copy of the parameters."""
    objective = functools.partial(local_loss, cfg=cfg, mesh_cfg=mesh_cfg, data=data)
    local, grads = jax.value_and_grad(objective)(params, tokens)
    return zero.psum_scalar(local, (*axis_tuple(data), "pipe")), grads


def overlapped_loss_and_grads(params, tokens, cfg, mesh_cfg, plan, codecs, residual=None):
    """(global loss, this rank's reduced gradient chunk), each layer's gradient reduced over the
    data levels in the backward as soon as it is produced (`layers.layer_reduce`), the shared
    parameters' after it: the chunk `zero.reduce` gives, with the same bits (each call coded as
    the whole vector's would be: `codecs`, from `zero.whole_codecs`).

    Where the transport can start a layer's first reduce-scatter and finish it later
    (`jaxhc.collectives.started`: the MPI transport's progress threads), the backward only
    starts it, and the layers' reductions are finished after the backward, in the order they
    were started, so the earlier layers' backward runs while their bytes move.

    `residual` (error feedback: every level's residual, innermost first, as the optimizer state
    holds it): each reduction takes its segment's part of every level's residual (a level's
    residual is a run of whole pieces: `FlatLayout.split`) and gives its new one, which a value's
    coding never mixes with another segment's; returns (loss, chunk, the new residual, its
    padding zeroed as `zero.reduce` leaves it), the bits of `zero.reduce`."""
    layout, shard = plan.layout, plan.shard
    shared = {k: v for k, v in params.items() if k != "blocks"}
    feedback = residual is not None
    parts = zero.split_residual(residual, layout.padded, shard) if feedback else []
    parts = [layout.split(p) for p in parts]  # per level: (shared part, (layers, layer part))

    def reduce_row(flat, scattered=0, res=None):
        return zero.reduce_gradients(flat, layout, res, shard, scattered, codecs)

    steps = zero.levels(shard)
    row = jax.ShapeDtypeStruct((layout.layer_padded,), jnp.float32)
    axis = steps[0][0] if steps else None
    codec = codecs.get((axis, "scatter"))
    start = axis is not None and started.can_start(
        row, axis, codec=codec, kind="grad", feedback=feedback
    )
    begun = {}  # the started calls' description (the same for every layer)

    def start_row(flat, res=None):
        first = None if res is None else res[0]
        begun["call"] = started.psum_scatter_start(
            flat, axis, codec=codec, kind="grad", residual=first
        )
        return begun["call"].handle if res is None else (begun["call"].handle, None)

    def sync_row(flat, res=None):
        if res is None:
            return reduce_row(flat)
        out, new = reduce_row(flat, res=list(res))
        return out, tuple(new)

    width = 1 if start else layout.layer_padded // shard.grads
    sink = jnp.zeros((layout.layers, width), jnp.float32)
    layer_res = tuple(p[1] for p in parts)  # per level: (layers, the layer's part)

    def objective(shared, sink, layer_res):
        blocks = (params["blocks"], sink, layer_res) if feedback else (params["blocks"], sink)
        fetch = layer_reduce(layout, start_row if start else sync_row)
        full = {**shared, "blocks": blocks}
        return local_loss(full, tokens, cfg, mesh_cfg, shard.data_axis, fetch)

    argnums = (0, 1, 2) if feedback and not start else (0, 1)
    local, grads = jax.value_and_grad(objective, argnums=argnums)(shared, sink, layer_res)
    g, layers, new_layers = (*grads, None)[:3]
    flat = layout.shared_flat(sum_shared(g, shard.axes))
    if feedback:
        g, new_shared = reduce_row(flat, res=[p[0] for p in parts])
    else:
        g = reduce_row(flat)
    if start:  # the last layer's was started first
        call = begun["call"]

        def finish(_, xs):
            if not feedback:
                return None, reduce_row(started.psum_scatter_done(call.like(xs)), 1)
            handle, rest = xs
            mine, first = started.psum_scatter_done(call.like(handle))
            out, new = reduce_row(mine, 1, list(rest))
            return None, (out, (first, *new))

        xs = (layers, layer_res[1:]) if feedback else layers
        layers = lax.scan(finish, None, xs, reverse=True)[1]
        if feedback:
            layers, new_layers = layers
    loss = zero.psum_scalar(local, (*axis_tuple(shard.data_axis), "pipe"))
    if not feedback:
        return loss, layout.join(g, layers)
    new = [layout.join(a, b) for a, b in zip(new_shared, new_layers, strict=True)]
    return loss, layout.join(g, layers), zero.unpadded_residual(jnp.concatenate(new), layout, shard)


def overlaps(plan: Plan, fidelity_every: int = 0, codecs=None) -> bool:
    """Whether the train step can reduce the gradients layer by layer in the backward
    (`train.overlap`) with the bits of the whole vector's reduction: `can_overlap` for `plan`,
    the policy of `jaxhc.context` and every lossy codec of the reduction (`codecs`:
    `zero.whole_codecs`) coding a segment's values as the whole vector's (the pieces' `align` a
    multiple of its `segment_values`)."""
    align = plan.layout.align
    cut = all(
        c is None or c.lossless or (c.segment_values and align % c.segment_values == 0)
        for c in (codecs or {}).values()
    )
    axes = plan.shard.axes if plan.shard else ("data",)
    own = plan.error_feedback and keeps_own(context.policy(), axes)
    return can_overlap(plan.sharded_params, plan.mesh_cfg.microbatches, own, fidelity_every, cut)


def can_overlap(
    sharded_params: bool,
    microbatches: int,
    keeps_own: bool = False,
    fidelity_every: int = 0,
    cut: bool = True,
) -> bool:
    """The rule of `overlaps` on a plan's facts (the planner asks it too: `jaxhc.plan.steptime`):
    parameters not sharded (sharded ones are reduced in their gathers' backward), one
    micro-batch (the reductions would otherwise run once per micro-batch), no fidelity sampling
    (it needs the unreduced gradients), error-feedback residuals only without the policy's
    ``keep_own`` (`keeps_own`), and the reduction's codecs cut at segments (`cut`).

    >>> can_overlap(sharded_params=False, microbatches=1), can_overlap(False, 1, keeps_own=True)
    (True, False)
    """
    return cut and not sharded_params and microbatches == 1 and not keeps_own and not fidelity_every


def keeps_own(policy, axes) -> bool:
    """Whether `policy` adds each rank's own slice uncoded (``keep_own``) in the error-feedback
    gradient reduce-scatters over any of the data (sub-)axes `axes`."""
    return policy is not None and any(policy.keep_own(a) for a in axes)


def sum_shared(grads, data=("data",)):
    """The gradients of the parameters every stage holds (`jaxhc.parallel.layout.SHARED`),
    summed among the stages that need them: those the last stage reads (``ln_f``, the head:
    ``wte`` when tied, else ``lm_head``; their canonical copies are the first stage's) over the
    pair of end stages, in one message each way; the first stage's alone (``wpe``, an untied
    ``wte``) only where `paired` says. The other stages' copies keep their own (zero)
    gradients: stale copies that nothing reads."""
    stages = jaxhc.axis_size("pipe")
    if stages == 1:
        return grads
    pair = {k: grads[k] for k in paired(grads, data)}
    return {**grads, **jaxhc.psum_pair(pair, "pipe", (0, stages - 1), kind="grad")}


def paired(grads, data) -> tuple[str, ...]:
    """`pairs` of the shared parameters of `grads`, under the policy of `jaxhc.context` and the
    sizes of the `data` (sub-)axes."""
    sizes = {axis: jaxhc.axis_size(axis) for axis in axis_tuple(data)}
    return pairs(tuple(grads), context.policy(), sizes)


def pairs(names, policy, data_sizes) -> tuple[str, ...]:
    """The shared parameters among `names` whose gradients the end stages sum: those the last
    stage reads (`PAIRED` but an untied ``wte``), and all of them when `policy` reduces float32
    gradients with a lossy codec over a data (sub-)axis of more than one rank (`data_sizes`, its
    ``min_bytes`` aside): its blocks may span neighbouring parameters of the flat ZeRO vector
    (``wpe`` lies between ``ln_f`` and ``wte``), so the end stages' reductions give the paired
    parameters the same bits only if their other shared gradients are the same too. The
    planner asks it too (`jaxhc.plan.cost.collectives`)."""
    first_only = ("wpe", "wte") if "lm_head" in names else ("wpe",)
    for axis, size in data_sizes.items() if policy is not None else ():
        codec = policy.codec_for(axis, "grad", jnp.float32)
        if size > 1 and codec is not None and not codec.lossless:
            first_only = ()
    return tuple(k for k in (*PAIRED, "wpe") if k in names and k not in first_only)


def loss_and_grads(params, tokens, cfg, mesh_cfg):
    """Global loss (every rank) and this rank's gradients, not yet summed over "data"."""
    loss, grads = local_loss_and_grads(params, tokens, cfg, mesh_cfg)
    return loss, sum_shared(grads)


def sharded_loss_and_grads(
    chunk, opt_state, tokens, cfg, mesh_cfg, plan, overlap=False, choose=None
):
    """Sharded parameters (s_p > 1): (global loss, this rank's reduced gradient chunk, opt_state)
    from its parameter chunk. The parameters are gathered over the parameter group, whose
    reverse mode reduce-scatters the gradients over the same levels; `zero.reduce` does the
    levels outside. Error-feedback residuals of the parameter levels ride along as the gathers'
    inputs (their cotangent: the new residuals).

    ``mesh.shard.gather: whole``: the whole chunk at once (`zero.gather_params`). ``layer``:
    the shared parameters so, and each layer's part of the chunk inside the layer scan, forward
    and again backward (`layers.layer_fetch`; with `overlap`, started a layer ahead where the
    transport can: `jaxhc.parallel.prefetch`); the layers' gradients are reduce-scattered one
    layer at a time (`layers.scatter_layers`). ``keep``: each layer's part gathered in the forward
    only (`jaxhc.parallel.keep`), its gradient's reduce-scatter started in the backward where
    the transport can. `choose`: how the parameter gathers run (`keep.first_gathers`; None:
    under the step's policy)."""
    shard, layout = plan.shard, plan.layout
    summed = functools.partial(sum_shared, data=shard.axes)
    scattered = len(shard.param_axes)
    residual = opt_state.get("residual")
    mine = () if residual is None else tuple(zero.split_residual(residual, layout.padded, shard))
    mine = mine[:scattered]
    data = shard.data_axis

    if not shard.per_layer:
        gather = zero.gather_params(
            layout.unflatten, lambda ct: layout.flatten(summed(ct)), shard, choose
        )

        def objective(chunk, residuals):
            return local_loss(gather(chunk, residuals), tokens, cfg, mesh_cfg, data)

        local, (g, done) = jax.value_and_grad(objective, argnums=(0, 1))(chunk, mine)
    else:
        gather = zero.gather_params(
            layout.shared_tree, lambda ct: layout.shared_flat(summed(ct)), shard, choose
        )
        shared, pieces = layout.split(chunk)
        parts = [layout.split(r) for r in mine]  # per level: (shared part, layers' parts)
        width, finish = layout.layer_values, None
        if shard.gather == "keep":  # gathered ahead in the forward, kept for the backward
            codecs = zero.whole_codecs(layout, shard)
            start = overlap and mesh_cfg.microbatches == 1 and residual is None
            reduce_row, pad, width, finish = keep.row_reducer(layout, shard, codecs, start)
            fetch = keep.Keep(layout, shard, reduce_row, pad, overlap, choose)
        else:
            fetch = prefetch.layer_fetch(layout, shard, overlap)
        sink = jnp.zeros((layout.layers, width), jnp.float32)

        def objective(shared, sink, residuals):
            params = {**gather(shared, residuals), "blocks": (pieces, sink)}
            return local_loss(params, tokens, cfg, mesh_cfg, data, fetch)

        res = tuple(p[0] for p in parts)
        local, (g, layers, done) = jax.value_and_grad(objective, argnums=(0, 1, 2))(
            shared, sink, res
        )
        steps = zero.levels(shard)[:scattered]
        if finish is not None:  # the first level's reduce-scatters started in the backward
            layers = finish(layers)
        elif mine:
            layers = layout.pad_layers(layers)
            layers, new = scatter_layers(layers, steps, [p[1] for p in parts])
            done = tuple(layout.join(s, n) for s, n in zip(done, new, strict=True))
        else:
            layers = scatter_layers(layout.pad_layers(layers), steps)
        g = layout.join(g, layers)
    loss = zero.psum_scalar(local, (*shard.axes, "pipe"))
    g, opt_state = zero.reduce(g, opt_state, layout, shard, scattered, done)
    return loss, g, opt_state
