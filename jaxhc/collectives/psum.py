"""Compressed psum: a compressed reduce-scatter followed by a compressed all-gather."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxhc._compat import axis_tuple, check_vma_enabled, like, make_varying
from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _buckets, volume
from jaxhc.collectives import _common as c
from jaxhc.collectives import _feedback as ef
from jaxhc.transport import current as transport


def psum(
    x,
    axis_name,
    *,
    axis_index_groups=None,
    codec: CodecLike = None,
    policy=None,
    kind=None,
    residual=None,
    bucket_bytes: int | None = _buckets.DEFAULT_BUCKET_BYTES,
):
    """`jax.lax.psum` whose traffic is compressed by `codec` (or by `policy` for `kind` traffic).
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    Each rank splits its array into P chunks, encodes them, and sends chunk j to rank j
    (all_to_all); rank j decodes the P pieces of its chunk, sums them in float32 in rank order,
    encodes the sum, and all ranks all-gather and decode the reduced chunks. Every rank, the owner
    included, uses the decoded values, so replicas stay bit-identical. Per rank this moves
    ~2(P-1)/P x raw / ratio bytes, like a ring allreduce. If any rank's input cannot be encoded
    within the codec's promise (NaN/Inf under ZFP, over budget under MPC), every rank falls back
    to the plain psum for that call. Gradients flow through the same compressed algorithm,
    and so do `jax.jvp` tangents.

    A pytree travels in buckets (`jaxhc.collectives._buckets`): its array leaves, grouped by dtype
    in tree order, are concatenated into messages of at most `bucket_bytes` raw bytes (default
    32 MiB; a larger leaf is a message of its own), each reduced as one array with one agreement
    vote and one ledger record, and split back. Under a policy, ``min_bytes`` applies to the
    message, so small leaves bundled together are compressed. A fallback (NaN/Inf, MPC budget)
    then sends the whole bucket raw. Under a lossy block codec each leaf starts on a whole block,
    so its error is the one it has when sent alone. ``bucket_bytes=None`` (or 0): one message per
    leaf.

    With ``residual=`` (error feedback, see `jaxhc.collectives._feedback`): each rank sends
    ``x + residual`` and the call returns ``(out, new_residual)``; the residual has x's shape (and
    tree) in float32 (float64 for float64 x) and starts at zero. Such calls are not differentiated
    (they carry gradients) and do not take the MPI transport's fused path (they need the decoded
    values of what this rank sent); they go leaf by leaf, not in buckets.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    >>> def f(g):                                   # runs per shard
    ...     return jaxhc.psum(g, "data", codec="mpc")   # lossless: lax.psum's values
    >>> step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    >>> step(jnp.arange(8.0).reshape(2, 4))
    Array([[ 4.,  6.,  8., 10.],
           [ 4.,  6.,  8., 10.]], dtype=float32)
    >>> def ef(g, res):                              # error feedback: residual in and out
    ...     return jaxhc.psum(g, "data", codec="zfp:8", residual=res)
    >>> specs = (P("data"), P("data"))
    >>> ef_step = jax.jit(jax.shard_map(ef, mesh=mesh, in_specs=specs, out_specs=specs))
    >>> out, res = ef_step(jnp.ones((2, 1024)), jnp.zeros((2, 1024)))
    >>> out.shape, res.dtype
    ((2, 1024), dtype('float32'))
    """
    if axis_index_groups is not None:
        if codec is None and policy is None and residual is None:
            return jax.lax.psum(x, axis_name, axis_index_groups=axis_index_groups)
        raise ValueError("jaxhc.psum: axis_index_groups is not supported with compression")
    if residual is not None:
        one = lambda a, r: _one_ef(a, r, axis_name, codec, policy, kind)  # noqa: E731
        return ef.pairs(one, x, residual, "jaxhc.psum")
    return _buckets.reduce_tree(
        x,
        axis_name,
        bucket_bytes,
        lambda a: _one(a, axis_name, codec, policy, kind),
        lambda a: c.resolve(a, axis_name, codec, policy, kind),
        lambda flat, chosen, nbytes: _send(flat, axis_name, chosen, kind, nbytes),
    )


def _one_ef(x, residual, axis_name, codec, policy, kind):
    ef.check(x, residual, "jaxhc.psum")
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, _ = c.prepare(x, axis_name)
    residual, _ = c.prepare(residual, axis_name)
    return _run(x, axis_name, chosen, kind, residual)


def _one(x, axis_name, codec, policy, kind):
    if c.python_number(x):  # a trace-time constant, the same on every rank (as jax.lax folds it)
        return x * transport().axis_size(axis_name)
    x = c.as_array(x)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    return _send(c.prepare(x, axis_name)[0], axis_name, chosen, kind)


def _send(x, axis_name, chosen: Codec | None, kind, nbytes=None):
    """The psum of `x` (prepared) with the resolved codec; `nbytes`: its raw bytes when `x`
    carries padding (a bucket), for the ledger."""
    vma = check_vma_enabled()
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, kind, nbytes)
    return _psum(x, axis_name, chosen, kind, vma, nbytes)


def _psum(x, axis_name, codec: Codec | None, kind, vma: bool, nbytes=None):
    return c.linear(
        x,
        lambda a: _run(a, axis_name, codec, kind, nbytes=nbytes),
        lambda ct: _bwd(axis_name, codec, kind, vma, nbytes, ct),
    )


def _bwd(axis_name, codec, kind, vma, nbytes, ct):
    if vma:  # psum maps varying -> invariant; its transpose is the identity per shard.
        return make_varying(ct, axis_tuple(axis_name))
    return _psum(ct, axis_name, codec, kind, vma, nbytes)


def _plain(x, axis_name, kind, nbytes=None):
    parts = transport().axis_size(axis_name)
    raw = volume.raw("psum", parts, c.nbytes(x) if nbytes is None else nbytes)
    wire = volume.raw("psum", parts, c.nbytes(x))
    return c.record(axis_name, kind, raw, wire, anchor=transport().psum(x, axis_name))


def _run(x, axis_name, codec: Codec | None, kind, residual=None, nbytes=None):
    """The compressed psum of `x`; with `residual`, (the psum of x + residual, new residual).
    `nbytes`: the raw bytes of what `x` holds when it carries padding (a bucket)."""
    t = transport()
    parts = t.axis_size(axis_name)
    feedback = residual is not None
    y, send = ef.carry(x, residual) if feedback else (None, x)
    if codec is None or parts == 1:
        out = _plain(send, axis_name, kind, nbytes)
        return (out, ef.kept(y, send)) if feedback else out
    n, shape, dtype = x.size, x.shape, x.dtype
    raw = volume.raw("psum", parts, c.nbytes(x) if nbytes is None else nbytes)
    if not feedback and t.fused(codec, dtype, axis_name):
        out, wire, fell = t.fused_psum(x, axis_name, codec)
        return c.record(axis_name, kind, raw, wire, fell, anchor=out)
    agree = volume.agreement(codec, parts)
    rows, m = c.to_rows(send, parts)
    payloads, ok = c.encode_rows(codec, rows)
    sent = (parts - 1) * payloads.shape[1] + agree
    mine = t.axis_index(axis_name) if feedback else None

    def unrows(r):  # (P, m) rows -> x's shape, dropping the padding of to_rows
        per = -(-max(n, 1) // parts)  # values per chunk before to_rows padded rows to m
        return r[:, :per].reshape(-1)[:n].reshape(shape)

    def reduce_scatter_then_gather():
        reduced = codec.decode_sum(t.all_to_all_rows(payloads, axis_name), m, dtype)
        payload, ok2 = c.encode_one(codec, reduced)

        def gather():
            got = t.all_gather_rows(payload, axis_name)
            c.record(
                axis_name, kind, raw, sent + (parts - 1) * payload.shape[0] + agree, anchor=got
            )
            out = c.decode_rows(codec, got, m, dtype)
            # The owner's loss on its reduced chunk: the second encode's residual.
            lost = reduced.astype(y.dtype) - out[mine].astype(y.dtype) if feedback else None
            return out, lost

        def gather_raw():
            got = t.all_gather_rows(reduced, axis_name)
            wire = sent + (parts - 1) * c.nbytes(reduced) + agree
            c.record(axis_name, kind, raw, wire, True, anchor=got)
            return got, like(jnp.zeros(m, y.dtype), y) if feedback else None

        out, lost2 = c.guarded(ok2, axis_name, codec, gather, gather_raw)
        if not feedback:
            return unrows(out), None
        lost = c.to_rows(y, parts)[0] - c.decode_rows(codec, payloads, m, dtype).astype(y.dtype)
        owned = jnp.arange(parts)[:, None] == mine
        return unrows(out), unrows(jnp.where(owned, lost + lost2, lost))

    def plain():
        wire = volume.raw("psum", parts, c.nbytes(x)) + agree
        out = c.record(axis_name, kind, raw, wire, True, anchor=t.psum(send, axis_name))
        return out, ef.kept(y, send) if feedback else None

    out, new = c.guarded(ok, axis_name, codec, reduce_scatter_then_gather, plain)
    return (out, new) if feedback else out
