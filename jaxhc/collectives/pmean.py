"""Compressed pmean: the compressed psum divided by the number of participants."""

from __future__ import annotations

import jax
from jax import lax

from jaxhc.codecs import CodecLike
from jaxhc.collectives import _buckets
from jaxhc.collectives.psum import psum


def pmean(
    x,
    axis_name,
    *,
    axis_index_groups=None,
    codec: CodecLike = None,
    policy=None,
    kind=None,
    bucket_bytes: int | None = _buckets.DEFAULT_BUCKET_BYTES,
):
    """`jax.lax.pmean` whose traffic is compressed by `codec` (or by `policy` for `kind` traffic).
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    The sum travels as `jaxhc.psum` does (reduce-scatter then all-gather, every rank using the
    decoded values); the division is local, as in `jax.lax.pmean`, so integers give floats and
    Python scalars stay Python scalars. A pytree travels in buckets of at most `bucket_bytes`,
    as in `jaxhc.psum`.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    >>> f = jax.shard_map(lambda g: jaxhc.pmean(g, "data", codec="mpc"), mesh=mesh,
    ...                   in_specs=P("data"), out_specs=P("data"))
    >>> jax.jit(f)(jnp.arange(8.0).reshape(2, 4))
    Array([[2., 3., 4., 5.],
           [2., 3., 4., 5.]], dtype=float32)
    """
    if axis_index_groups is not None and codec is None and policy is None:
        return lax.pmean(x, axis_name, axis_index_groups=axis_index_groups)
    total = psum(
        x,
        axis_name,
        axis_index_groups=axis_index_groups,
        codec=codec,
        policy=policy,
        kind=kind,
        bucket_bytes=bucket_bytes,
    )
    n = psum(1, axis_name)
    return jax.tree.map(lambda v: v / n, total)
