"""The conjugate pair all_gather / psum_scatter: each one's gradient is the other.

`gather` encodes the local block, gathers the payloads and decodes them all (its own included);
`scatter` encodes the P slices, exchanges them (all_to_all) and sums the decoded pieces in float32
in rank order. A tangent goes through the same collective and a cotangent through the other
(`_common.linear`), compressed by the same codec (codec None: the plain collective, still
recorded by the ledger in both directions).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxhc._compat import axis_tuple, make_varying
from jaxhc.codecs import Codec
from jaxhc.collectives import _common as c
from jaxhc.collectives import _feedback as ef
from jaxhc.collectives import volume
from jaxhc.transport import current as transport


def _gather_raw(x, axis_name, axis, tiled, to, vma):
    kw = {"to": to} if vma and to != "varying" else {}
    return transport().all_gather(x, axis_name, axis=axis, tiled=tiled, **kw)


def gather_plain(x, axis_name, axis, tiled, to, kind, vma):
    raw = volume.raw("all_gather", transport().axis_size(axis_name), c.nbytes(x))
    return c.record(
        axis_name, kind, raw, raw, anchor=_gather_raw(x, axis_name, axis, tiled, to, vma)
    )


def gather(x, axis_name, axis, tiled, to, codec: Codec | None, kind, vma):
    return c.linear(
        x,
        lambda a: _gather_run(a, axis_name, axis, tiled, to, codec, kind, vma),
        lambda ct: _gather_bwd(axis_name, axis, tiled, to, codec, kind, vma, ct),
    )


def _gather_bwd(axis_name, axis, tiled, to, codec, kind, vma, ct):
    if vma and to == "invarying":  # replicated output: each rank's cotangent is its own slice.
        return make_varying(_own_slice(ct, axis_name, axis, tiled), axis_tuple(axis_name))
    return scatter(ct, axis_name, axis, tiled, codec, kind, vma)


def _own_slice(ct, axis_name, axis, tiled):
    parts = transport().axis_size(axis_name)
    idx = transport().axis_index(axis_name)
    size = ct.shape[axis] // parts if tiled else 1
    piece = lax.dynamic_slice_in_dim(ct, idx * size, size, axis)
    return piece if tiled else jnp.squeeze(piece, axis)


def _gather_run(x, axis_name, axis, tiled, to, codec: Codec | None, kind, vma):
    if codec is None:
        return gather_plain(x, axis_name, axis, tiled, to, kind, vma)
    t = transport()
    parts = t.axis_size(axis_name)
    raw = volume.raw("all_gather", parts, c.nbytes(x))

    def arrange(rows):  # (P, x.size) -> the gathered array
        out = jnp.moveaxis(rows.reshape((parts,) + x.shape), 0, axis)
        if tiled:
            out = out.reshape(x.shape[:axis] + (parts * x.shape[axis],) + x.shape[axis + 1 :])
        return make_varying(out, axis_tuple(axis_name)) if to == "varying" else out

    if t.fused(codec, x.dtype, axis_name):
        rows, wire, fell = t.fused_all_gather(x, axis_name, codec)
        return c.record(axis_name, kind, raw, wire, fell, anchor=arrange(rows))
    payload, ok = c.encode_one(codec, x)
    agree = volume.agreement(codec, parts)

    def compressed():
        got = t.all_gather_rows(payload, axis_name)
        c.record(axis_name, kind, raw, (parts - 1) * payload.shape[0] + agree, anchor=got)
        return arrange(c.decode_rows(codec, got, x.size, x.dtype))

    def plain():
        out = _gather_raw(x, axis_name, axis, tiled, to, vma)
        return c.record(axis_name, kind, raw, raw + agree, True, anchor=out)

    return c.guarded(ok, axis_name, codec, compressed, plain)


def scatter_plain(x, axis_name, dim, tiled, kind):
    parts = transport().axis_size(axis_name)
    raw = volume.raw("psum_scatter", parts, c.nbytes(x))
    out = transport().psum_scatter(x, axis_name, scatter_dimension=dim, tiled=tiled)
    return c.record(axis_name, kind, raw, raw, anchor=out)


def scatter(x, axis_name, dim, tiled, codec: Codec | None, kind, vma):
    return c.linear(
        x,
        lambda a: scatter_run(a, axis_name, dim, tiled, codec, kind),
        lambda ct: gather(ct, axis_name, dim, tiled, "varying", codec, kind, vma),
    )


def scatter_run(x, axis_name, dim, tiled, codec: Codec | None, kind, residual=None):
    """This rank's reduced slice; with `residual` (error feedback), (that slice, new residual)."""
    feedback = residual is not None
    t = transport()
    # Error feedback in one native call (the MPI transport: the carry, the coding, the wire and
    # the new residual in one pass over the segments; the same values), for gradient
    # reduce-scatters only (``kind="grad"``: the trainer's, whose residual is a train state input
    # and whose values come from dots and sums): the native add matches XLA's carry when both
    # operands exist as arrays, but XLA:CPU computes a value in one fusion with its consumer
    # differently (a product contracted into the add, a vectorized transcendental: 2 of 256
    # residual values from an in-program ``0.01 * sin(x)``), so other calls keep the unfused
    # algorithm, XLA's bits whatever computed their operands.
    fused_feedback = feedback and kind == "grad" and t.fused_feedback(codec, x.dtype, axis_name)
    y, send = ef.carry(x, residual) if feedback and not fused_feedback else (None, x)
    if codec is None:
        out = scatter_plain(send, axis_name, dim, tiled, kind)
        return (out, ef.kept(y, send)) if feedback else out
    parts = t.axis_size(axis_name)
    raw = volume.raw("psum_scatter", parts, c.nbytes(x))
    agree = volume.agreement(codec, parts)
    moved = jnp.moveaxis(send, dim, 0)
    chunk_shape = (moved.shape[0] // parts,) + moved.shape[1:] if tiled else moved.shape[1:]
    size = moved.size // parts
    rows = moved.reshape(parts, size)

    def arrange(reduced):  # this rank's reduced row (size values) -> its slice of the result
        reduced = reduced.reshape(chunk_shape)
        return jnp.moveaxis(reduced, 0, dim) if tiled else reduced

    if fused_feedback:
        kept = jnp.moveaxis(residual, dim, 0).reshape(parts, size)
        mine, new, wire, fell = t.fused_psum_scatter_feedback(rows, kept, axis_name, codec)
        out = c.record(axis_name, kind, raw, wire, fell, anchor=arrange(mine))
        return out, jnp.moveaxis(new.reshape(moved.shape), 0, dim)
    if not feedback and t.fused(codec, x.dtype, axis_name):
        mine, wire, fell = t.fused_psum_scatter(rows, axis_name, codec)
        return c.record(axis_name, kind, raw, wire, fell, anchor=arrange(mine))
    rows, m = c.pad_rows(rows)
    payloads, ok = c.encode_rows(codec, rows)

    def compressed():
        got = t.all_to_all_rows(payloads, axis_name)
        c.record(axis_name, kind, raw, (parts - 1) * payloads.shape[1] + agree, anchor=got)
        out = arrange(codec.decode_sum(got, m, x.dtype)[:size])
        if not feedback:
            return out, None
        decoded = c.decode_rows(codec, payloads, m, x.dtype)[:, :size].astype(y.dtype)
        lost = jnp.moveaxis(y, dim, 0).reshape(parts, size) - decoded
        return out, jnp.moveaxis(lost.reshape(moved.shape), 0, dim)

    def plain():
        out = t.psum_scatter(send, axis_name, scatter_dimension=dim, tiled=tiled)
        c.record(axis_name, kind, raw, raw + agree, True, anchor=out)
        return out, ef.kept(y, send) if feedback else None

    out, new = c.guarded(ok, axis_name, codec, compressed, plain)
    return (out, new) if feedback else out
