"""Compressed psum: a compressed reduce-scatter followed by a compressed all-gather."""

from __future__ import annotations

import jax

from jaxhc._compat import axis_tuple, make_varying
from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
from jaxhc.transport import current as transport


def psum(x, axis_name, *, axis_index_groups=None, codec: CodecLike = None, policy=None, kind=None):
    """`jax.lax.psum` whose traffic is compressed by `codec` (or by `policy` for `kind` traffic).

    Each rank splits its array into P chunks, encodes them, and sends chunk j to rank j
    (all_to_all); rank j decodes the P pieces of its chunk, sums them in float32 in rank order,
    encodes the sum, and all ranks all-gather and decode the reduced chunks. Every rank, the owner
    included, uses the decoded values, so replicas stay bit-identical. Per rank this moves
    ~2(P-1)/P x raw / ratio bytes, like a ring allreduce. If any rank's input cannot be encoded
    within the codec's promise (NaN/Inf under ZFP, over budget under MPC), every rank falls back
    to the plain psum for that call. Gradients flow through the same compressed algorithm,
    and so do `jax.jvp` tangents.

    >>> y = jaxhc.psum(grads, "data", codec="zfp:8")                 # doctest: +SKIP
    >>> y = jaxhc.psum(grads, "data", policy="zhybrid", kind="grad")  # doctest: +SKIP
    """
    if axis_index_groups is not None:
        if codec is None and policy is None:
            return jax.lax.psum(x, axis_name, axis_index_groups=axis_index_groups)
        raise ValueError("jaxhc.psum: axis_index_groups is not supported with compression")
    return jax.tree.map(lambda a: _one(a, axis_name, codec, policy, kind), x)


def _one(x, axis_name, codec, policy, kind):
    if c.python_number(x):  # a trace-time constant, the same on every rank (as jax.lax folds it)
        return x * transport().axis_size(axis_name)
    x = c.as_array(x)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, vma = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, kind)
    return _psum(x, axis_name, chosen, kind, vma)


def _psum(x, axis_name, codec: Codec | None, kind, vma: bool):
    return c.linear(
        x,
        lambda a: _run(a, axis_name, codec, kind),
        lambda ct: _bwd(axis_name, codec, kind, vma, ct),
    )


def _bwd(axis_name, codec, kind, vma, ct):
    if vma:  # psum maps varying -> invariant; its transpose is the identity per shard.
        return make_varying(ct, axis_tuple(axis_name))
    return _psum(ct, axis_name, codec, kind, vma)


def _plain(x, axis_name, kind):
    parts = transport().axis_size(axis_name)
    raw = 2 * (parts - 1) / parts * c.nbytes(x)
    return c.record(axis_name, kind, raw, raw, anchor=transport().psum(x, axis_name))


def _run(x, axis_name, codec: Codec | None, kind):
    t = transport()
    parts = t.axis_size(axis_name)
    if codec is None or parts == 1:
        return _plain(x, axis_name, kind)
    n, shape, dtype = x.size, x.shape, x.dtype
    raw = 2 * (parts - 1) / parts * c.nbytes(x)
    if t.fused(codec, dtype, axis_name):
        y, wire, fell = t.fused_psum(x, axis_name, codec)
        return c.record(axis_name, kind, raw, wire, fell, anchor=y)
    agree = c.agreement_bytes(codec, parts)
    rows, m = c.to_rows(x, parts)
    payloads, ok = c.encode_rows(codec, rows)
    sent = (parts - 1) * payloads.shape[1] + agree

    def reduce_scatter_then_gather():
        reduced = codec.decode_sum(t.all_to_all_rows(payloads, axis_name), m, dtype)
        payload, ok2 = c.encode_one(codec, reduced)

        def gather():
            got = t.all_gather_rows(payload, axis_name)
            c.record(
                axis_name, kind, raw, sent + (parts - 1) * payload.shape[0] + agree, anchor=got
            )
            return c.decode_rows(codec, got, m, dtype)

        def gather_raw():
            got = t.all_gather_rows(reduced, axis_name)
            wire = sent + (parts - 1) * c.nbytes(reduced) + agree
            return c.record(axis_name, kind, raw, wire, True, anchor=got)

        out = c.guarded(ok2, axis_name, codec, gather, gather_raw)
        per = -(-max(n, 1) // parts)  # values per chunk before to_rows padded rows to m
        return out[:, :per].reshape(-1)[:n].reshape(shape)

    def plain():
        return c.record(axis_name, kind, raw, raw + agree, True, anchor=t.psum(x, axis_name))

    return c.guarded(ok, axis_name, codec, reduce_scatter_then_gather, plain)
