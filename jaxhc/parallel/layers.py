"""The ZeRO step's per-layer collectives: a layer's parameters gathered as its forward and
backward need them (`layer_fetch`, per-layer ZeRO-3), its gradient reduced as soon as the
backward produces it (`layer_reduce`), and the layers' local gradients reduce-scattered one
layer at a time (`scatter_layers`); the same bits as `jaxhc.parallel.zero`'s whole-vector
collectives. `jaxhc.parallel.prefetch` and `jaxhc.parallel.keep` start these a layer ahead on
the MPI transport.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax import lax

from jaxhc.parallel import zero
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layout import FlatLayout

__all__ = ["layer_fetch", "layer_reduce", "scatter_layers", "without_params"]


def layer_fetch(layout: FlatLayout, shard: ShardPlan) -> Callable:
    """Per-layer ZeRO-3: ``fetch(layer, h, (piece, sink)) -> layer(params, h)``, where params
    are the layer's part of the device's parameter chunk (`FlatLayout.split`) all-gathered over
    the parameter group, outermost sub-axis first (``kind="param"``), as `zero.gather_params`
    gathers the whole vector (the same bits: a layer's part of every chunk is that layer's own
    chunk).

    Its reverse mode gathers the parameters again: of the layer's autodiff residuals (`jax.vjp`)
    it keeps all but the gathered parameters themselves, which the backward gathers anew and
    puts back; so a device holds one layer's gathered parameters at a time, and the activations
    are kept as without it. (`jax.checkpoint` cannot do this: it never recomputes an effectful
    computation, and the ledger's callbacks make the gather one, so under a Ledger it would
    keep the gathered parameters instead.)

    The layer's gradient leaves through `sink` (a zero vector of the layer's values, unpadded:
    `FlatLayout.layer_values`): its cotangent is the layer's local gradient, flattened, which
    autodiff sums over the micro-batches before `scatter_layers` reduce-scatters it, in the
    order the whole vector's reduction sums it. (Scattering each micro-batch's gradient in its
    own backward would add the micro-batches after the ranks: other bits.) The piece gets no
    cotangent.
    """

    def gathered(piece):
        return layout.layer_tree(zero.gather_chunk(piece, shard))

    def fetch(layer, h, xs):
        where = {}  # how the backward puts the gathered parameters back among the residuals

        @jax.custom_vjp
        def run(h, piece, sink):
            return layer(gathered(piece), h)

        def fwd(h, piece, sink):
            params = gathered(piece)
            out, pullback = jax.vjp(layer, params, h)
            kept, where["put_back"] = without_params(pullback, params)
            return out, (piece, kept)

        def bwd(res, ct):
            piece, kept = res
            pullback = where["put_back"](kept, gathered(piece))  # the second gather
            ct_params, ct_h = pullback(ct)
            flat = layout.layer_flat(jax.tree.map(lambda x: x[None], ct_params), pad=False)
            return ct_h, None, flat[0]

        run.defvjp(fwd, bwd)
        return run(h, *xs)

    return fetch


def without_params(pullback, params) -> tuple[list, Callable]:
    """The residuals of ``pullback = jax.vjp(layer, params, h)[1]`` without `params` among them
    (None in their places), and ``put_back(kept, params) -> pullback`` with `params` (the same
    values, gathered again) in those places."""
    leaves, tree = jax.tree.flatten(pullback)
    index = {id(p): i for i, p in enumerate(jax.tree.leaves(params))}
    where = [index.get(id(x)) for x in leaves]
    kept = [None if i is not None else x for x, i in zip(leaves, where, strict=True)]

    def put_back(kept, params):
        params = jax.tree.leaves(params)
        return tree.unflatten(
            [x if i is None else params[i] for x, i in zip(kept, where, strict=True)]
        )

    return kept, put_back


def layer_reduce(layout: FlatLayout, reduce_row: Callable) -> Callable:
    """Unsharded parameters, gradients reduced in the backward: ``fetch(layer, h, (params,
    sink)) -> layer(params, h)``, whose reverse mode gives the layer's parameters no cotangent
    and gives `sink` (zeros shaped like what `reduce_row` returns: the reduction's result, or
    the handle of a started one) ``reduce_row(row)``, where row
    is the layer's gradient flattened into its padded segment (`FlatLayout.layer_flat`). Each
    layer's reduction is thus issued as soon as the backward has produced its gradient, while
    the earlier layers' backward is still to run, and the segments' reductions joined give the
    whole vector's bits (a segment's pieces are whole codec blocks). One micro-batch only: the
    sinks' cotangents of several would be added after their reductions.

    Error feedback: ``xs = (params, sink, residuals)`` (the layer's parts of the levels'
    residuals); ``reduce_row(row, residuals)`` then gives (the sink's cotangent, the residuals'
    cotangent: the new residuals, or None where a started call gives them at its done)."""

    def fetch(layer, h, xs):
        @jax.custom_vjp
        def run(h, params, sink, *residuals):
            return layer(params, h)

        def fwd(h, params, sink, *residuals):
            out, pullback = jax.vjp(layer, params, h)
            return out, (pullback, residuals)

        def bwd(saved, ct):
            pullback, residuals = saved
            ct_params, ct_h = pullback(ct)
            row = layout.layer_flat(jax.tree.map(lambda x: x[None], ct_params))[0]
            if not residuals:
                return ct_h, None, reduce_row(row)
            return ct_h, None, *reduce_row(row, *residuals)

        run.defvjp(fwd, bwd)
        return run(h, *xs)

    return fetch


def scatter_layers(grads, steps, residuals=None):
    """Reduce-scatter each layer's local gradient (a row of `grads`, (layers, padded segment))
    over the parameter levels `steps`, innermost first (``kind="grad"``), one layer at a time;
    with `residuals` (error feedback: per level, (layers, ...) rows), (chunks, new residuals)."""

    def one(_, xs):
        if residuals is None:
            return None, zero.scatter_levels(xs, steps)
        g, new = zero.scatter_levels(xs[0], steps, list(xs[1]))
        return None, (g, tuple(new))

    xs = grads if residuals is None else (grads, tuple(residuals))
    out = lax.scan(one, None, xs)[1]
    return out if residuals is None else (out[0], list(out[1]))
