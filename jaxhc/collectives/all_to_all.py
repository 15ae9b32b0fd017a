"""Compressed all_to_all: each of the P chunks is encoded, exchanged and decoded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc._checks import split_dim
from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
from jaxhc.collectives import volume
from jaxhc.transport import current as transport


def all_to_all(
    x,
    axis_name,
    split_axis: int,
    concat_axis: int,
    *,
    axis_index_groups=None,
    tiled: bool = False,
    codec: CodecLike = None,
    policy=None,
    kind=None,
):
    """`jax.lax.all_to_all` whose traffic is compressed by `codec` (or `policy` for `kind`).
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    The gradient is the compressed all_to_all with split and concat axes swapped.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("tensor",))
    >>> f = jax.shard_map(lambda x: jaxhc.all_to_all(x, "tensor", 1, 0, tiled=True, codec="mpc"),
    ...                   mesh=mesh, in_specs=P("tensor"), out_specs=P("tensor"))
    >>> jax.jit(f)(jnp.arange(8.0).reshape(2, 4))   # each rank's (1, 4) block -> (2, 2)
    Array([[0., 1.],
           [4., 5.],
           [2., 3.],
           [6., 7.]], dtype=float32)
    """
    if axis_index_groups is not None:
        if codec is None and policy is None:
            return lax.all_to_all(
                x,
                axis_name,
                split_axis,
                concat_axis,
                axis_index_groups=axis_index_groups,
                tiled=tiled,
            )
        raise ValueError("jaxhc.all_to_all: axis_index_groups is not supported with compression")
    return jax.tree.map(
        lambda a: _one(a, axis_name, split_axis, concat_axis, tiled, codec, policy, kind), x
    )


def _one(x, axis_name, split_axis, concat_axis, tiled, codec, policy, kind):
    parts = transport().axis_size(axis_name)
    x = c.as_array(x)
    split_axis, concat_axis = _check_axes(x, split_axis, concat_axis, tiled, parts)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, _ = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, split_axis, concat_axis, tiled, kind)
    return _exchange(x, axis_name, split_axis, concat_axis, tiled, chosen, kind)


def _plain(x, axis_name, split_axis, concat_axis, tiled, kind):
    parts = transport().axis_size(axis_name)
    raw = volume.raw("all_to_all", parts, c.nbytes(x))
    out = transport().all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)
    return c.record(axis_name, kind, raw, raw, anchor=out)


def _check_axes(x, split_axis, concat_axis, tiled, parts):
    where = "jaxhc.all_to_all"
    if not -x.ndim <= concat_axis < x.ndim:
        raise ValueError(f"{where}: concat_axis {concat_axis} out of range for shape {x.shape}")
    return split_dim(x, split_axis, tiled, parts, where, "split_axis"), concat_axis % x.ndim


def _exchange(x, axis_name, split_axis, concat_axis, tiled, codec: Codec | None, kind):
    return c.linear(
        x,
        lambda a: _compressed(a, axis_name, split_axis, concat_axis, tiled, codec, kind),
        lambda ct: _exchange(ct, axis_name, concat_axis, split_axis, tiled, codec, kind),
    )


def _compressed(x, axis_name, split_axis, concat_axis, tiled, codec: Codec | None, kind):
    if codec is None:
        return _plain(x, axis_name, split_axis, concat_axis, tiled, kind)
    t = transport()
    parts = t.axis_size(axis_name)
    raw = volume.raw("all_to_all", parts, c.nbytes(x))
    agree = volume.agreement(codec, parts)
    moved = jnp.moveaxis(x, split_axis, 0)
    # chunk j (what rank j receives): the slice j along split_axis, in x's axis order.
    if tiled:
        chunks = moved.reshape((parts, moved.shape[0] // parts) + moved.shape[1:])
        chunks = jnp.moveaxis(chunks, 1, split_axis + 1)
    else:
        chunks = moved
    chunk_shape = chunks.shape[1:]
    size = chunks[0].size
    rows, m = c.pad_rows(chunks.reshape(parts, size))
    payloads, ok = c.encode_rows(codec, rows)

    def exchange():
        got = t.all_to_all_rows(payloads, axis_name)
        c.record(axis_name, kind, raw, (parts - 1) * payloads.shape[1] + agree, anchor=got)
        got = c.decode_rows(codec, got, m, x.dtype)
        got = got[:, :size].reshape((parts,) + chunk_shape)
        out = jnp.moveaxis(got, 0, concat_axis)
        if tiled:  # merge the rank axis into the concat axis
            shape = chunk_shape[:concat_axis] + (parts * chunk_shape[concat_axis],)
            out = out.reshape(shape + chunk_shape[concat_axis + 1 :])
        return out

    def plain():
        out = t.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)
        return c.record(axis_name, kind, raw, raw + agree, True, anchor=out)

    return c.guarded(ok, axis_name, codec, exchange, plain)
