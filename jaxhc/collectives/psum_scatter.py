"""Compressed psum_scatter: the reduce-scatter half of the compressed psum."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
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
):
    """`jax.lax.psum_scatter` whose traffic is compressed by `codec` (or `policy` for `kind`).

    Each rank encodes the P slices of `x` along `scatter_dimension`, sends slice j to rank j, and
    rank j decodes the P pieces (its own included) and sums them in float32 in rank order. The
    gradient is a compressed `all_gather`.

    >>> shard = jaxhc.psum_scatter(g, "data", tiled=True, codec="zfp:8")  # doctest: +SKIP
    """
    if axis_index_groups is not None:
        if codec is None and policy is None:
            return lax.psum_scatter(
                x,
                axis_name,
                scatter_dimension=scatter_dimension,
                axis_index_groups=axis_index_groups,
                tiled=tiled,
            )
        raise ValueError("jaxhc.psum_scatter: axis_index_groups is not supported with compression")
    return jax.tree.map(
        lambda a: _one(a, axis_name, scatter_dimension, tiled, codec, policy, kind), x
    )


def _one(x, axis_name, dim, tiled, codec, policy, kind):
    parts = transport().axis_size(axis_name)
    dim = _check_dim(x, dim, tiled, parts)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, vma = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, dim, tiled, kind)
    return _scatter(x, axis_name, dim, tiled, chosen, kind, vma)


def _plain(x, axis_name, dim, tiled, kind):
    parts = transport().axis_size(axis_name)
    raw = (parts - 1) / parts * c.nbytes(x)
    out = transport().psum_scatter(x, axis_name, scatter_dimension=dim, tiled=tiled)
    return c.record(axis_name, kind, raw, raw, anchor=out)


def _check_dim(x, dim, tiled, parts):
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"jaxhc.psum_scatter: scatter_dimension {dim} out of range for {x.shape}")
    dim %= x.ndim
    size = x.shape[dim]
    if (tiled and size % parts) or (not tiled and size != parts):
        need = f"a multiple of {parts}" if tiled else f"equal to the axis size {parts}"
        raise ValueError(f"jaxhc.psum_scatter: dimension {dim} of shape {x.shape} must be {need}")
    return dim


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _scatter(x, axis_name, dim, tiled, codec: Codec | None, kind, vma):
    return _compressed(x, axis_name, dim, tiled, codec, kind)


def _fwd(x, axis_name, dim, tiled, codec, kind, vma):
    return _compressed(x, axis_name, dim, tiled, codec, kind), None


def _bwd(axis_name, dim, tiled, codec, kind, vma, _, ct):
    from jaxhc.collectives.all_gather import _gather

    return (_gather(ct, axis_name, dim, tiled, "varying", codec, kind, vma),)


_scatter.defvjp(_fwd, _bwd)


def _compressed(x, axis_name, dim, tiled, codec: Codec | None, kind):
    if codec is None:
        return _plain(x, axis_name, dim, tiled, kind)
    t = transport()
    parts = t.axis_size(axis_name)
    raw = (parts - 1) / parts * c.nbytes(x)
    agree = c.agreement_bytes(codec, parts)
    moved = jnp.moveaxis(x, dim, 0)
    chunk_shape = (moved.shape[0] // parts,) + moved.shape[1:] if tiled else moved.shape[1:]
    size = moved.size // parts
    rows = moved.reshape(parts, size)
    rows, m = c.pad_rows(rows)
    payloads, ok = c.encode_rows(codec, rows)

    def scatter():
        got = t.all_to_all_rows(payloads, axis_name)
        c.record(axis_name, kind, raw, (parts - 1) * payloads.shape[1] + agree, anchor=got)
        pieces = c.decode_rows(codec, got, m, x.dtype)
        reduced = c.sum_rows(pieces, x.dtype).astype(x.dtype)[:size].reshape(chunk_shape)
        return jnp.moveaxis(reduced, 0, dim) if tiled else reduced

    def plain():
        out = t.psum_scatter(x, axis_name, scatter_dimension=dim, tiled=tiled)
        return c.record(axis_name, kind, raw, raw + agree, True, anchor=out)

    return c.guarded(ok, axis_name, codec, scatter, plain)
