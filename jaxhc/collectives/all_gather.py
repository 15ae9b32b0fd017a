"""Compressed all_gather: encode the local block, gather payloads, decode all (own included)."""

from __future__ import annotations

import jax
from jax import lax

from jaxhc.codecs import CodecLike
from jaxhc.collectives import _common as c
from jaxhc.collectives._gather_scatter import gather, gather_plain


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
    Given neither, the policy of `jaxhc.context` chooses (none there: the plain collective).

    Every rank decodes every gathered payload, its own included, so all ranks hold identical values.
    The gradient is a compressed `psum_scatter` (the identity slice when ``to="invarying"`` under
    ``check_vma``).

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    >>> def f(shard):
    ...     return jaxhc.all_gather(shard, "data", tiled=True, to="invarying", codec="mpc")
    >>> jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P()))(jnp.arange(4.0))
    Array([0., 1., 2., 3.], dtype=float32)
    """
    if axis_index_groups is not None:
        if codec is None and policy is None:
            return lax.all_gather(
                x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled
            )
        raise ValueError("jaxhc.all_gather: axis_index_groups is not supported with compression")
    return jax.tree.map(lambda a: _one(a, axis_name, axis, tiled, to, codec, policy, kind), x)


def _one(x, axis_name, axis, tiled, to, codec, policy, kind):
    x = c.as_array(x)
    if to not in ("varying", "invarying"):
        raise ValueError(f"jaxhc.all_gather: to={to!r} must be 'varying' or 'invarying'")
    axis = _check_axis(x, axis, tiled)
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    x, vma = c.prepare(x, axis_name)
    if chosen is None and not c.differentiable(x):
        return gather_plain(x, axis_name, axis, tiled, to, kind, vma)
    return gather(x, axis_name, axis, tiled, to, chosen, kind, vma)


def _check_axis(x, axis, tiled):
    ndim = x.ndim + (0 if tiled else 1)
    if not -ndim <= axis < ndim:
        raise ValueError(f"jaxhc.all_gather: axis {axis} out of range for shape {x.shape}")
    return axis % ndim
