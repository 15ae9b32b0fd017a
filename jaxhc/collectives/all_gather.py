"""Compressed all_gather: encode the local block, gather payloads, decode all (own included)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc._compat import axis_tuple, make_varying
from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
from jaxhc.transport import current as transport


def all_gather(
    x,
    axis_name,
    *,
    axis_index_groups=None,
    axis: int = 0,
    tiled: bool = False,
    to: str = "varying",
    codec: CodecLike = None,
    policy=None,
    kind=None,
):
    """`jax.lax.all_gather` whose traffic is compressed by `codec` (or by `policy` for `kind`).

    Every rank decodes every gathered payload, its own included, so all ranks hold identical values.
    The gradient is a compressed `psum_scatter` (the identity slice when ``to="invarying"`` under
    ``check_vma``).

    >>> full = jaxhc.all_gather(shard, "data", axis=0, tiled=True, codec="mpc")   # doctest: +SKIP
    """
    if axis_index_groups is not None:
        if codec is None and policy is None:
            return lax.all_gather(
                x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled
            )
        raise ValueError("jaxhc.all_gather: axis_index_groups is not supported with compression")
    return jax.tree.map(lambda a: _one(a, axis_name, axis, tiled, to, codec, policy, kind), x)


def _one(x, axis_name, axis, tiled, to, codec, policy, kind):
    if to not in ("varying", "invarying"):
        raise ValueError(f"jaxhc.all_gather: to={to!r} must be 'varying' or 'invarying'")
    axis = _check_axis(x, axis, tiled)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, vma = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, axis, tiled, to, kind, vma)
    return _gather(x, axis_name, axis, tiled, to, chosen, kind, vma)


def _check_axis(x, axis, tiled):
    ndim = x.ndim + (0 if tiled else 1)
    if not -ndim <= axis < ndim:
        raise ValueError(f"jaxhc.all_gather: axis {axis} out of range for shape {x.shape}")
    return axis % ndim


def _raw(x, axis_name, axis, tiled, to, vma):
    kw = {"to": to} if vma and to != "varying" else {}
    return transport().all_gather(x, axis_name, axis=axis, tiled=tiled, **kw)


def _plain(x, axis_name, axis, tiled, to, kind, vma):
    raw = (transport().axis_size(axis_name) - 1) * c.nbytes(x)
    return c.record(axis_name, kind, raw, raw, anchor=_raw(x, axis_name, axis, tiled, to, vma))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6, 7))
def _gather(x, axis_name, axis, tiled, to, codec: Codec | None, kind, vma):
    return _compressed(x, axis_name, axis, tiled, to, codec, kind, vma)


def _fwd(x, axis_name, axis, tiled, to, codec, kind, vma):
    return _compressed(x, axis_name, axis, tiled, to, codec, kind, vma), None


def _bwd(axis_name, axis, tiled, to, codec, kind, vma, _, ct):
    from jaxhc.collectives.psum_scatter import _scatter

    if vma and to == "invarying":  # replicated output: each rank's cotangent is its own slice.
        return (make_varying(_own_slice(ct, axis_name, axis, tiled), axis_tuple(axis_name)),)
    return (_scatter(ct, axis_name, axis, tiled, codec, kind, vma),)


_gather.defvjp(_fwd, _bwd)


def _own_slice(ct, axis_name, axis, tiled):
    parts = transport().axis_size(axis_name)
    idx = transport().axis_index(axis_name)
    size = ct.shape[axis] // parts if tiled else 1
    piece = lax.dynamic_slice_in_dim(ct, idx * size, size, axis)
    return piece if tiled else jnp.squeeze(piece, axis)


def _compressed(x, axis_name, axis, tiled, to, codec: Codec | None, kind, vma):
    if codec is None:
        return _plain(x, axis_name, axis, tiled, to, kind, vma)
    t = transport()
    parts = t.axis_size(axis_name)
    raw = (parts - 1) * c.nbytes(x)
    payload, ok = c.encode_one(codec, x)
    agree = c.agreement_bytes(codec, parts)

    def gather():
        got = t.all_gather_rows(payload, axis_name)
        c.record(axis_name, kind, raw, (parts - 1) * payload.shape[0] + agree, anchor=got)
        rows = c.decode_rows(codec, got, x.size, x.dtype)
        out = jnp.moveaxis(rows.reshape((parts,) + x.shape), 0, axis)
        if tiled:
            out = out.reshape(x.shape[:axis] + (parts * x.shape[axis],) + x.shape[axis + 1 :])
        return make_varying(out, axis_tuple(axis_name)) if to == "varying" else out

    def plain():
        out = _raw(x, axis_name, axis, tiled, to, vma)
        return c.record(axis_name, kind, raw, raw + agree, True, anchor=out)

    return c.guarded(ok, axis_name, codec, gather, plain)
