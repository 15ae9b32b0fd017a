"""Compressed ppermute: encode, permute the payload, decode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc._compat import like
from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
from jaxhc.collectives import volume
from jaxhc.transport import current as transport


def ppermute(x, axis_name, perm, *, codec: CodecLike = None, policy=None, kind=None):
    """`jax.lax.ppermute` whose traffic is compressed by `codec` (or `policy` for `kind`).
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    Ranks that receive nothing get zeros, as with `jax.lax.ppermute`. The gradient is the compressed
    ppermute with the inverse permutation.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("pipe",))
    >>> f = jax.shard_map(lambda h: jaxhc.ppermute(h, "pipe", [(0, 1), (1, 0)], codec="mpc"),
    ...                   mesh=mesh, in_specs=P("pipe"), out_specs=P("pipe"))
    >>> jax.jit(f)(jnp.arange(4.0))                 # the two ranks swap their blocks
    Array([2., 3., 0., 1.], dtype=float32)
    """
    perm = tuple((int(s), int(d)) for s, d in perm)
    return jax.tree.map(lambda a: _one(a, axis_name, perm, codec, policy, kind), x)


def _one(x, axis_name, perm, codec, policy, kind):
    parts = transport().axis_size(axis_name)
    _check_perm(perm, parts)
    x = c.as_array(x)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, _ = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return _plain(x, axis_name, perm, kind)
    return _permute(x, axis_name, perm, chosen, kind)


def _plain(x, axis_name, perm, kind, nbytes=None):
    senders, parts = len(perm), transport().axis_size(axis_name)
    raw = volume.permute(senders, parts, c.nbytes(x) if nbytes is None else nbytes)
    wire = volume.permute(senders, parts, c.nbytes(x))
    out = transport().ppermute(x, axis_name, perm)
    return c.record(axis_name, kind, raw, wire, anchor=out)


def _check_perm(perm, parts):
    srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(f"jaxhc.ppermute: perm {list(perm)} repeats a source or a destination")
    bad = [i for i in srcs + dsts if not 0 <= i < parts]
    if bad:
        raise ValueError(f"jaxhc.ppermute: perm index {bad[0]} is outside the axis size {parts}")


def _permute(x, axis_name, perm, codec: Codec | None, kind):
    inverse = tuple((d, s) for s, d in perm)
    return c.linear(
        x,
        lambda a: _compressed(a, axis_name, perm, codec, kind),
        lambda ct: _permute(ct, axis_name, inverse, codec, kind),
    )


def exchange(x, axis_name, perm, codec: Codec | None, kind, nbytes=None):
    """(what this rank receives, `x` as its destination decodes it): the ppermute of a prepared
    `x` under `codec` (None: plain), for a caller that combines the two
    (`jaxhc.collectives.psum_pair`; the second is meaningful on the ranks that both send and
    receive). `nbytes`: x's raw bytes without a bucket's padding, for the ledger."""
    if codec is None:
        return _plain(x, axis_name, perm, kind, nbytes), x
    return _compressed(x, axis_name, perm, codec, kind, nbytes, sent=True)


def _compressed(x, axis_name, perm, codec: Codec | None, kind, nbytes=None, sent=False):
    """The ppermute of `x`; with `sent`, (that, x as its destination decodes it)."""
    if codec is None:
        return _plain(x, axis_name, perm, kind)
    t = transport()
    parts = t.axis_size(axis_name)
    raw = volume.permute(len(perm), parts, c.nbytes(x) if nbytes is None else nbytes)
    payload, ok = c.encode_one(codec, x)
    agree = volume.agreement(codec, parts)
    receivers = sorted(d for _, d in perm)
    senders = sorted(s for s, _ in perm)
    if len(senders) < parts and codec.may_fail:
        # Only what is sent must fit the codec: a rank that sends nothing (a pipeline bubble)
        # votes yes whatever it holds, so its garbage cannot force the raw path on the others.
        sends = jnp.isin(t.ppermute_index(axis_name), jnp.asarray(senders))
        ok = jnp.logical_or(ok, jnp.logical_not(sends))

    def decoded(p):
        return c.decode_rows(codec, p[None], x.size, x.dtype)[0].reshape(x.shape)

    def received(got):
        return (decoded(got), decoded(payload)) if sent else decoded(got)

    def permute():
        got = t.ppermute(payload, axis_name, perm)
        c.record(
            axis_name,
            kind,
            raw,
            volume.permute(len(perm), parts, payload.shape[0]) + agree,
            anchor=got,
        )
        if len(receivers) == parts:
            return received(got)
        # Ranks that receive nothing hold a zero payload, which is no valid stream for every
        # codec: they skip decoding and return zeros, as lax.ppermute does.
        me = t.ppermute_index(axis_name)  # perm's numbering: mesh order for a tuple of axes
        receives = jnp.isin(me, jnp.asarray(receivers))
        zeros = like(jnp.zeros(x.shape, x.dtype), got)
        return lax.cond(receives, received, lambda _: (zeros, zeros) if sent else zeros, got)

    def plain():
        out = t.ppermute(x, axis_name, perm)
        c.record(
            axis_name,
            kind,
            raw,
            volume.permute(len(perm), parts, c.nbytes(x)) + agree,
            True,
            anchor=out,
        )
        return (out, x) if sent else out

    return c.guarded(ok, axis_name, codec, permute, plain)
