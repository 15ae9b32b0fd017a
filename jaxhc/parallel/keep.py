"""Sharded parameters gathered a layer ahead in the forward and kept for the backward
(``mesh.shard.gather: keep``).

Between steps a rank holds its chunk of the parameters, as under ZeRO-3; the optimizer update
leaves it there, so no all-gather follows the update. The next forward gathers each layer's
parameters over the parameter group, started one layer ahead where the transport can
(`jaxhc.parallel.prefetch`'s pipeline: the MPI transport's progress threads move layer i + 1's
bytes while layer i computes), and keeps the gathered layer among the layer's autodiff residuals,
so the backward gathers nothing: ZeRO-1's memory during the step, ZeRO-3's state between steps,
and the all-gather that followed ZeRO-1's update overlapped with the forward.

The backward hands each layer's gradient to `reduce_row` as soon as it is produced (the sink's
cotangent, as `jaxhc.parallel.layers.layer_reduce` does): with one micro-batch and no error
feedback on the MPI transport, it starts the first parameter level's reduce-scatter there and the
step finishes the layers' calls after the backward (`finish_rows`); otherwise the row is the
layer's local gradient, which `layers.scatter_layers` reduce-scatters after the backward.

The bits are ZeRO-1's with the same policy: every rank, the owner included, computes with the
param codec's decoded values of the same chunks, and the gradients are reduced level by level
in rank order as the whole vector's are. ZeRO-1's first step computes with the exact initial
parameters (its first gather follows the first update): under a lossy param codec this mode's
first step gathers them uncoded. The choice is made at each gather (`first_gathers`: a
`lax.cond` on the step around the gather, or around a started gather's start and again around
its done, which pair up as every rank takes the same branch of both), not around the whole
loss-and-gradient program, which would keep XLA from scheduling the step as one program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc import context
from jaxhc.collectives import started
from jaxhc.parallel import prefetch, zero
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layout import FlatLayout

__all__ = ["Keep", "first_gathers", "plain_params", "row_reducer"]


class Keep:
    """``scan(layer, x, (pieces, sink)) -> hidden``: the layers on their parameters gathered
    over the parameter group from `pieces` (layers, width: this device's part of each layer's
    chunk), started a layer ahead where the transport can, kept for the backward; the sink's
    cotangent (layers, ...) is ``reduce_row(row)`` of each layer's local gradient row; `choose`:
    how each gather runs (`first_gathers`; None: under the step's policy)."""

    def __init__(
        self, layout, shard: ShardPlan, reduce_row: Callable, pad: bool, ahead=True, choose=None
    ):
        self.layout, self.shard, self.reduce_row, self.pad = layout, shard, reduce_row, pad
        self.ahead = ahead  # `train.overlap`: gathers started a layer ahead where they can be
        self.choose = choose or _as_is

    def scan(self, layer, x, blocks):
        pieces, sink = blocks
        layers = pieces.shape[0]
        chain = prefetch._Chain(pieces.shape[1], layers, self.shard, self.choose)
        if not self.ahead:
            chain.depth = 0
        run = self._layer(layer, chain)
        pending = chain.prologue(lambda j: pieces[j], +1) if chain.depth else ()
        index = jnp.arange(layers, dtype=jnp.int32)

        def body(carry, xs):
            h, pending = carry
            return run(h, pending, pieces, *xs), None

        return lax.scan(body, (x, pending), (index, sink))[0][0]

    def _layer(self, layer, chain: prefetch._Chain):
        layout, shard, choose = self.layout, self.shard, self.choose

        def gather(h, pending, whole, i):
            """Layer i's parameters, and the next layer's gather started before the layer runs
            (the barrier keeps XLA from running it first)."""
            if not chain.depth:  # nothing can be started: gathered here, synchronously
                piece = lax.dynamic_index_in_dim(whole, i, keepdims=False)
                flat = choose(lambda p: zero.gather_chunk(p, shard), piece)
                return layout.layer_tree(flat), h, pending
            params = layout.layer_tree(chain.params(pending))
            take = lambda j: lax.dynamic_index_in_dim(  # noqa: E731
                whole, jnp.clip(j, 0, chain.layers - 1), keepdims=False
            )
            ahead = chain.advance(i, pending, take, +1)
            h, ahead = lax.optimization_barrier((h, ahead))
            return params, h, ahead

        @jax.custom_vjp
        def run(h, pending, whole, i, sink):
            params, h, ahead = gather(h, pending, whole, i)
            return layer(params, h), ahead

        def fwd(h, pending, whole, i, sink):
            params, h, ahead = gather(h, pending, whole, i)
            out, pullback = jax.vjp(layer, params, h)  # the gathered layer kept among them
            return (out, ahead), (pullback, pending)

        def bwd(res, ct):
            pullback, pending = res
            ct_params, ct_h = pullback(ct[0])
            row = layout.layer_flat(jax.tree.map(lambda x: x[None], ct_params), pad=self.pad)
            zeros = jax.tree.map(jnp.zeros_like, pending)
            return ct_h, zeros, None, None, self.reduce_row(row[0])

        run.defvjp(fwd, bwd)
        return run


def row_reducer(layout: FlatLayout, shard: ShardPlan, codecs: dict, start: bool):
    """(reduce_row, pad, sink width, finish) of `Keep` for this step: where a gradient row may
    start the first parameter level's reduce-scatter (`start`: overlap on, one micro-batch, no
    error feedback) and the transport can start it, the handle of that call, and
    ``finish(handles) -> (layers, piece)`` after the backward finishes the calls in the order
    they were started and reduces over the parameter levels after the first (`codecs`:
    `zero.whole_codecs`, as ZeRO-1's reduction sends the whole vector). Else (finish None) the
    row is the layer's local gradient, unpadded, for `layers.scatter_layers`."""
    steps = zero.levels(shard)[: len(shard.param_axes)]
    axis = steps[0][0] if steps else None
    codec = codecs.get((axis, "scatter"))
    row = jax.ShapeDtypeStruct((layout.layer_padded,), jnp.float32)
    if not (start and axis and started.can_start(row, axis, codec=codec, kind="grad")):
        return (lambda row: row), False, layout.layer_values, None
    begun = {}

    def begin(row):
        begun["call"] = started.psum_scatter_start(row, axis, codec=codec, kind="grad")
        return begun["call"].handle

    def finish(handles):
        chosen = [codecs[a, "scatter"] for a, _ in steps[1:]]

        def one(_, handle):
            x = started.psum_scatter_done(begun["call"].like(handle))
            return None, zero.scatter_levels(x, steps[1:], codecs=chosen)

        return lax.scan(one, None, handles, reverse=True)[1]  # the last layer's started first

    return begin, True, 1, finish


def plain_params(policy):
    """`policy` with its ``param`` traffic uncoded (None: None)."""
    if policy is None:
        return None

    def entry(e):
        overrides = tuple((k, c) for k, c in e.overrides if k != "param") + (("param", None),)
        return dataclasses.replace(
            e, overrides=overrides, dtypes=tuple(d for d in e.dtypes if d[0] != "param")
        )

    return dataclasses.replace(policy, axes=tuple((a, entry(e)) for a, e in policy.axes))


def _as_is(fn, *args):
    return fn(*args)


def first_gathers(step, shard: ShardPlan) -> Callable:
    """``choose(gather, *args)``: ``gather(*args)`` (a parameter gather, or a started one's start
    or done) traced under the step's policy, and where that codes a parameter gather lossily,
    also under `plain_params` of it, the latter run on step 0 (ZeRO-1's first forward runs on
    the exact initial parameters): one of the two, chosen by `step` (the same on every rank)."""
    policy = context.policy()
    lossy = policy is not None and any(
        (c := policy.codec_for(a, "param", jnp.float32)) is not None and not c.lossless
        for a in shard.param_axes
    )
    if not lossy:
        return _as_is
    first, plain = step == 0, plain_params(policy)

    def choose(gather, *args):
        def uncoded(*args):
            with context.use(policy=plain):
                return gather(*args)

        return lax.cond(first, uncoded, gather, *args)

    return choose
