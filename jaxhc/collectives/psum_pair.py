"""Compressed sum over two ranks of an axis: each sends its array to the other, once.

For a value of which only two ranks of an axis hold a share (a pipeline's tied embedding: the
first stage embeds with it, the last applies the head), a psum over the whole axis moves
2 (P - 1)/P of it per rank and makes every other rank take part for nothing. The pair's
exchange moves it once each way (a ring of two) and the other ranks send nothing.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _buckets
from jaxhc.collectives import _common as c
from jaxhc.collectives.ppermute import exchange
from jaxhc.transport import current as transport


def psum_pair(
    x,
    axis_name,
    pair,
    *,
    codec: CodecLike = None,
    policy=None,
    kind=None,
    bucket_bytes: int | None = _buckets.DEFAULT_BUCKET_BYTES,
):
    """The sum of `x` over the two ranks ``pair = (a, b)`` of `axis_name`, on both of them; every
    other rank gets its own `x` back (a group of one) and sends nothing. Compressed by `codec`
    (or `policy` for `kind` traffic); given neither, the policy of `jaxhc.context` chooses.

    a sends its array to b and b to a (`jaxhc.ppermute`'s algorithm: encode, permute, decode).
    Each adds, in rank order, its own array as the other decoded it and the other's decoded array,
    so both hold the same bits: ``decode(encode(x_a)) + decode(encode(x_b))`` under a lossy codec,
    ``x_a + x_b`` uncompressed (as `jax.lax.psum` over the two). If either array cannot be encoded
    within the codec's promise (NaN/Inf under ZFP, over budget under MPC), both travel raw. With
    ``a == b`` nothing moves and every rank gets `x`. Per rank of the axis this moves 2/P of x's
    bytes on average (psum: 2 (P - 1)/P). A pytree travels in buckets of at most
    `bucket_bytes`, as in `jaxhc.psum`. The pair sum is its own transpose: gradients (and
    `jax.jvp` tangents) travel by the same exchange.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:4]), ("pipe",))
    >>> f = jax.shard_map(lambda g: jaxhc.psum_pair(g, "pipe", (0, 3), codec="mpc"),
    ...                   mesh=mesh, in_specs=P("pipe"), out_specs=P("pipe"))
    >>> jax.jit(f)(jnp.arange(4.0))                 # ranks 0 and 3 add; 1 and 2 keep theirs
    Array([3., 1., 2., 3.], dtype=float32)
    """
    parts = transport().axis_size(axis_name)
    a, b = (int(r) for r in pair)
    if not (0 <= a < parts and 0 <= b < parts):
        raise ValueError(f"jaxhc.psum_pair: pair {tuple(pair)} is outside the axis size {parts}")
    if a == b:
        return x
    perm = ((a, b), (b, a))
    return _buckets.reduce_tree(
        x,
        axis_name,
        bucket_bytes,
        lambda leaf: _one(leaf, axis_name, perm, codec, policy, kind),
        lambda stand_in: c.resolve(stand_in, axis_name, codec, policy, kind),
        lambda flat, chosen, nbytes: _pair(flat, axis_name, perm, chosen, kind, nbytes),
        rows=1,  # whole arrays travel, not one chunk per rank
    )


def _one(x, axis_name, perm, codec, policy, kind):
    x = c.as_array(x)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    return _pair(c.prepare(x, axis_name)[0], axis_name, perm, chosen, kind)


def _pair(x, axis_name, perm, codec: Codec | None, kind, nbytes=None):
    def run(v):
        return _sum(v, axis_name, perm, codec, kind, nbytes)

    if not c.differentiable(x):
        return run(x)
    return c.linear(x, run, lambda ct: _pair(ct, axis_name, perm, codec, kind, nbytes))


def _sum(x, axis_name, perm, codec: Codec | None, kind, nbytes):
    (a, b), _ = perm
    got, sent = exchange(x, axis_name, perm, codec, kind, nbytes)
    me = transport().ppermute_index(axis_name)  # the numbering of `pair`, as ppermute's perm
    first, second = jnp.where(me == a, sent, got), jnp.where(me == a, got, sent)
    return jnp.where((me == a) | (me == b), first + second, x)
