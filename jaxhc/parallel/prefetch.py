"""Per-layer ZeRO-3 whose parameter gathers are started a layer ahead (``train.overlap``).

`jaxhc.parallel.layers.layer_fetch` gathers a layer's parameters over the parameter group just
before the layer runs, forward and again backward, and waits for them. Where the transport can
start those gathers and finish them later (`jaxhc.collectives.started`: the MPI transport's
progress threads), `layer_fetch` here starts layer i + 1's gather before layer i runs in the
forward, and layer i - 1's second gather before layer i's backward runs, so a layer's bytes move
while the layer before it computes. The gathers, their order, their codecs and their bits are
those of `layers.layer_fetch`; only where the program waits for them moves.

The layer scan carries the started calls' handles (float32 [1] each) beside the hidden state.
In the backward the handles travel as the carry's cotangents, as the started gradient
reductions' do (`jaxhc.parallel.layers.layer_reduce`): layer i's backward receives its own
parameters' started gather as the cotangent of the handle its forward passed on, and gives the
one it starts for the layer below as the cotangent of the handle it received. A last step after
the scan (`_tail`) starts the top layer's second gather when the backward reaches the layers.

A parameter group over nested data sub-axes gathers level by level, outermost first; each level
whose call the transport can start is one stage of the pipeline (its result arrives one layer
later, and the next level starts then), a level it cannot start runs synchronously where its
input is ready. With D started levels a layer's gather begins D layers ahead; with none the
layers are `layers.layer_fetch`'s. The train step takes it as ``gpt.run_blocks``'s fetch:
``gpt.run_blocks((pieces, sink), x, cfg, tp, layer_fetch(layout, shard, overlap))``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxhc
from jaxhc import context
from jaxhc.collectives import started
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.layers import layer_fetch as fetch_layers
from jaxhc.parallel.layers import without_params
from jaxhc.parallel.layout import FlatLayout

__all__ = ["Prefetch", "layer_fetch"]


def layer_fetch(layout: FlatLayout, shard: ShardPlan, overlap: bool = True):
    """The per-layer fetch of the train step (``gpt.run_blocks(..., fetch)``): with `overlap`,
    a `Prefetch` (which keeps `layers.layer_fetch`'s where nothing can be started), else
    `layers.layer_fetch`."""
    return Prefetch(layout, shard) if overlap else fetch_layers(layout, shard)


def _handle() -> jax.Array:
    """The handle slot of a call not started (a layer outside the stage's layers)."""
    return jnp.zeros((1,), jnp.float32)


def _when(valid, fn: Callable[[], jax.Array]) -> jax.Array:
    """``fn()`` (a started call's handle) where `valid` (a Python bool, or a traced one every rank
    of the call's group agrees on: a layer index), else an empty handle slot."""
    if isinstance(valid, bool):
        return fn() if valid else _handle()
    return lax.cond(valid, fn, _handle)


class _Chain:
    """One layer's gather over the parameter group as stages: the levels (outermost first) up
    to and including the first started one, then each started level with the synchronous
    levels after it. `starts[d]` is stage d's started level; `begun` keeps each started call's
    description (the same for every layer; one per policy it is traced under) from its first
    start. `choose(fn, *args)` runs each stage's start and each finish (`keep.first_gathers`:
    uncoded on a step chosen at run time; None: ``fn(*args)``)."""

    def __init__(self, width: int, layers: int, shard: ShardPlan, choose=None):
        self.layers = layers
        self.choose = choose or (lambda fn, *args: fn(*args))
        self.stages: list[list[str]] = [[]]
        n = width
        for axis in shard.param_axes:
            size = jaxhc.axis_size(axis)
            like = jax.ShapeDtypeStruct((n,), jnp.float32)
            self.stages[-1].append(axis)
            if size > 1 and started.can_start(like, axis, kind="param"):
                self.stages.append([])
            n *= size
        self.depth = len(self.stages) - 1  # D: how many layers ahead a gather begins
        self.begun: dict[tuple, started.Started] = {}

    @staticmethod
    def _sync(x, axes):
        for axis in axes:
            x = jaxhc.all_gather(x, axis, tiled=True, kind="param")
        return x

    def _start(self, d: int, x) -> jax.Array:
        """Stage d's synchronous levels, then its started level's call: the handle."""
        *sync, axis = self.stages[d]

        def start(x):
            call = started.all_gather_start(self._sync(x, sync), axis, tiled=True, kind="param")
            self.begun[d, id(context.policy())] = call
            return call.handle

        return self.choose(start, x)

    def _finish(self, d: int, handle) -> jax.Array:
        """Stage d's started call, finished (the last one's: and the levels after it)."""

        def finish(handle):
            x = started.all_gather_done(self.begun[d, id(context.policy())].like(handle))
            return self._sync(x, self.stages[-1]) if d == self.depth - 1 else x

        return self.choose(finish, handle)

    def advance(self, i, pending: tuple, piece: Callable[[object], jax.Array], sign: int):
        """One layer's step of the pipeline, going `sign` (+1 forward, -1 backward) from layer
        `i` (a Python int before and after the scan, traced in it): ``pending[d]`` holds stage
        d's call of layer ``i + sign (D - 1 - d)``; the result holds those of the next layer
        (layer ``i + sign (D - d)``'s next stage started, layer ``i + sign D``'s first stage:
        ``piece(j)`` is layer j's part of the chunk). Layer i's own last stage is not in it:
        `params` finishes that."""
        layers = self.layers
        new = [None] * self.depth
        for d in range(self.depth - 2, -1, -1):  # the nearest layer first, as it is needed first
            j = i + sign * (self.depth - 1 - d)
            new[d + 1] = _when(
                _inside(j, layers), lambda d=d: self._start(d + 1, self._finish(d, pending[d]))
            )
        j = i + sign * self.depth
        new[0] = _when(_inside(j, layers), lambda: self._start(0, piece(j)))
        return tuple(new)

    def params(self, pending: tuple) -> jax.Array:
        """The layer's gathered (padded) segment from its last stage's started call."""
        return self._finish(self.depth - 1, pending[-1])

    def prologue(self, piece, sign: int) -> tuple:
        """The pending calls before the first layer the scan runs (`sign` +1: layer 0, -1: the
        last), started as the layers before it would have."""
        pending = tuple(_handle() for _ in range(self.depth))
        first = 0 if sign > 0 else self.layers - 1
        for k in range(self.depth, 0, -1):
            pending = self.advance(first - sign * k, pending, piece, sign)
        return pending


def _inside(j, layers: int):
    if isinstance(j, int):
        return 0 <= j < layers
    return (j >= 0) & (j < layers)


class Prefetch:
    """``scan(layer, x, (pieces, sink)) -> hidden``: the layers of `layers.layer_fetch` (pieces:
    (layers, width), this device's part of each layer's chunk; sink: see there), run by a scan
    whose gathers are started ahead where the transport can (see the module)."""

    def __init__(self, layout: FlatLayout, shard: ShardPlan):
        self.layout, self.shard = layout, shard

    def scan(self, layer, x, blocks):
        pieces, sink = blocks
        layers = pieces.shape[0]
        chain = _Chain(pieces.shape[1], layers, self.shard)
        if not chain.depth:  # nothing can be started: layers.layer_fetch's layers
            fetch = fetch_layers(self.layout, self.shard)
            return lax.scan(lambda h, xs: (fetch(layer, h, xs), None), x, blocks)[0]

        run = self._layer(layer, chain)
        pending = chain.prologue(lambda j: pieces[j], +1)
        # Layer i's backward starts layer i - D's first stage: its piece rides along.
        behind = jnp.take(pieces, jnp.clip(jnp.arange(layers) - chain.depth, 0, None), axis=0)
        index = jnp.arange(layers, dtype=jnp.int32)

        def body(carry, xs):
            h, pending = carry
            return run(h, pending, pieces, *xs), None

        h, pending = lax.scan(body, (x, pending), (index, behind, sink))[0]
        return _tail(chain)(h, pending, pieces)

    def _layer(self, layer, chain: _Chain):
        layout = self.layout
        where = {}  # how the backward puts the gathered parameters back among the residuals

        def piece_of(whole):
            return lambda j: lax.dynamic_index_in_dim(
                whole, jnp.clip(j, 0, chain.layers - 1), keepdims=False
            )

        def gather(h, pending, whole, i):
            """Layer i's parameters, the next layer's calls started, and `h` (ready only once
            they are: the barrier keeps XLA from running the layer before the starts)."""
            params = layout.layer_tree(chain.params(pending))
            ahead = chain.advance(i, pending, piece_of(whole), +1)
            h, ahead = lax.optimization_barrier((h, ahead))
            return params, h, ahead

        @jax.custom_vjp
        def run(h, pending, whole, i, behind, sink):
            params, h, ahead = gather(h, pending, whole, i)
            return layer(params, h), ahead

        def fwd(h, pending, whole, i, behind, sink):
            params, h, ahead = gather(h, pending, whole, i)
            out, pullback = jax.vjp(layer, params, h)
            kept, where["put_back"] = without_params(pullback, params)
            return (out, ahead), (i, behind, kept)

        def bwd(res, ct):
            i, behind, kept = res
            ct_out, pending = ct  # this layer's second gather and those below it, started
            params = layout.layer_tree(chain.params(pending))
            below = chain.advance(i, pending, lambda j: behind, -1)
            ct_out, below = lax.optimization_barrier((ct_out, below))
            ct_params, ct_h = where["put_back"](kept, params)(ct_out)
            flat = layout.layer_flat(jax.tree.map(lambda x: x[None], ct_params), pad=False)
            return ct_h, below, None, None, None, flat[0]

        run.defvjp(fwd, bwd)
        return run


def _tail(chain: _Chain):
    """The identity on the hidden state after the layer scan, whose reverse mode starts the
    last layers' second gathers (the backward's prologue) and hands them to the scan's backward
    as the cotangent of its final handles."""

    @jax.custom_vjp
    def tail(h, pending, pieces):
        return h

    def fwd(h, pending, pieces):
        return h, pieces

    def bwd(pieces, ct):
        take = lambda j: pieces[j]  # noqa: E731  (j: a Python int here)
        return ct, chain.prologue(take, -1), None

    tail.defvjp(fwd, bwd)
    return tail
