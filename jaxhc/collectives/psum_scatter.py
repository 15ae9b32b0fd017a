"""Compressed psum_scatter: the reduce-scatter half of the compressed psum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc._checks import split_dim
from jaxhc.codecs import CodecLike
from jaxhc.collectives import _common as c
from jaxhc.collectives import _feedback as ef
from jaxhc.collectives._gather_scatter import scatter, scatter_plain, scatter_run
from jaxhc.transport import current as transport


def psum_scatter(
    x,
    axis_name,
    *,
    scatter_dimension: int = 0,
    axis_index_groups=None,
    tiled: bool = False,
    codec: CodecLike = None,
    policy=None,
    kind=None,
    residual=None,
):
    """`jax.lax.psum_scatter` whose traffic is compressed by `codec` (or `policy` for `kind`).
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    Each rank encodes the P slices of `x` along `scatter_dimension`, sends slice j to rank j, and
    rank j decodes the P pieces (its own included) and sums them in float32 in rank order. The
    gradient is a compressed `all_gather`.

    With ``residual=`` (error feedback, as in `jaxhc.psum`): each rank sends ``x + residual`` and
    the call returns ``(this rank's reduced slice, new_residual)``; the residual has x's shape.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    >>> f = jax.shard_map(lambda g: jaxhc.psum_scatter(g, "data", tiled=True, codec="mpc"),
    ...                   mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    >>> jax.jit(f)(jnp.arange(8.0))                 # rank r keeps slice r of the sum
    Array([ 4.,  6.,  8., 10.], dtype=float32)
    """
    if axis_index_groups is not None:
        if codec is None and policy is None and residual is None:
            return lax.psum_scatter(
                x,
                axis_name,
                scatter_dimension=scatter_dimension,
                axis_index_groups=axis_index_groups,
                tiled=tiled,
            )
        raise ValueError("jaxhc.psum_scatter: axis_index_groups is not supported with compression")
    if residual is not None:

        def one(a, r):
            ef.check(a, r, "jaxhc.psum_scatter")
            dim = _check_dim(a, scatter_dimension, tiled, transport().axis_size(axis_name))
            chosen = c.resolve(a, axis_name, codec, policy, kind)
            a, _ = c.prepare(a, axis_name)
            r, _ = c.prepare(r, axis_name)
            return scatter_run(a, axis_name, dim, tiled, chosen, kind, r)

        return ef.pairs(one, x, residual, "jaxhc.psum_scatter")
    return jax.tree.map(
        lambda a: _one(a, axis_name, scatter_dimension, tiled, codec, policy, kind), x
    )


def _one(x, axis_name, dim, tiled, codec, policy, kind):
    x = c.as_array(x)
    parts = transport().axis_size(axis_name)
    dim = _check_dim(x, dim, tiled, parts)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, vma = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return scatter_plain(x, axis_name, dim, tiled, kind)
    return scatter(x, axis_name, dim, tiled, chosen, kind, vma)


def _check_dim(x, dim, tiled, parts):
    if x.dtype == jnp.bool_:  # lax.psum_scatter traces it, then fails to lower it
        raise TypeError(f"jaxhc.psum_scatter: cannot sum booleans (shape {x.shape}, dtype bool)")
    return split_dim(x, dim, tiled, parts, "jaxhc.psum_scatter", "scatter_dimension")
