"""A process's block of a global array under a PartitionSpec, and assembling blocks back.

The one rule for which process holds which block of a sharded array, used by the launchers, the
train state, checkpoints and canonical layouts: `block_slices` / `local_block` cut a process's
block out of a global array, `owns_block` says whether a process holds the canonical copy of a
block (the first along every mesh axis the spec does not name), `assemble` puts blocks back.
The names of a nested data axis's levels, which specs and collectives name, are `data_axes`'s;
`parent_axis` reads a level's name back as the mesh axis it splits.

>>> import numpy as np
>>> from jax.sharding import PartitionSpec as P
>>> from jaxhc import partition
>>> x = np.arange(8).reshape(2, 4)
>>> partition.local_block(P(None, "data"), x, {"data": 1}, {"data": 2})
array([[2, 3],
       [6, 7]])
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

__all__ = [
    "assemble",
    "block_slices",
    "data_axes",
    "global_shape",
    "is_spec",
    "local_block",
    "map_specs",
    "owns_block",
    "parent_axis",
]


def data_axes(levels: int) -> tuple[str, ...]:
    """The names of the data axis's `levels` nested levels, outermost first: "data" alone for one
    level, else the sub-axes ``data.0`` (outermost) ... ``data.<levels - 1>`` (innermost).

    >>> jaxhc.partition.data_axes(1), jaxhc.partition.data_axes(3)
    (('data',), ('data.0', 'data.1', 'data.2'))
    """
    return ("data",) if levels == 1 else tuple(f"data.{i}" for i in range(levels))


def parent_axis(name: str) -> str:
    """The mesh axis that the sub-axis `name` (``<axis>.<i>``) splits; any other name as it is.

    >>> jaxhc.partition.parent_axis("data.1"), jaxhc.partition.parent_axis("tensor")
    ('data', 'tensor')
    """
    return name.split(".")[0]


def is_spec(s) -> bool:
    """Whether `s` is a leaf of a spec tree: a PartitionSpec or None (replicated).

    >>> from jax.sharding import PartitionSpec as P
    >>> from jaxhc.partition import is_spec
    >>> is_spec(P("data")), is_spec(None), is_spec((P(),))
    (True, True, False)
    """
    return s is None or isinstance(s, P)


def map_specs(fn, specs, tree):
    """Apply fn(spec, leaf), `specs` being a pytree prefix of `tree` (as shard_map's specs are).

    >>> from jax.sharding import PartitionSpec as P
    >>> tree = {"w": np.zeros((4, 2)), "b": np.zeros(2)}
    >>> specs = {"w": P("data"), "b": None}
    >>> jaxhc.partition.map_specs(lambda spec, x: (spec, x.shape), specs, tree)
    {'b': (None, (2,)), 'w': (P('data',), (4, 2))}
    """

    def per_subtree(spec, sub):
        return jax.tree.map(lambda leaf: fn(spec, leaf), sub)

    return jax.tree.map(per_subtree, specs, tree, is_leaf=is_spec)


def _entries(spec, ndim, mesh_shape):
    entries = tuple(spec or ()) + (None,) * (ndim - len(tuple(spec or ())))
    if len(entries) > ndim:
        raise ValueError(f"spec {spec} has more entries than the array has dimensions ({ndim})")
    out = []
    for e in entries:
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        for a in axes:
            if a not in mesh_shape:
                raise ValueError(f"spec {spec} names axis {a!r}, not in the mesh {mesh_shape}")
        out.append(axes)
    return out


def _index(axes, coords, mesh_shape):
    idx = 0
    for a in axes:
        idx = idx * mesh_shape[a] + coords[a]
    return idx


def block_slices(spec, shape, coords, mesh_shape) -> tuple[slice, ...]:
    """The slices of a global array of `shape` that the process at `coords` holds under `spec`.

    >>> from jax.sharding import PartitionSpec as P
    >>> jaxhc.partition.block_slices(P("data"), (8, 3), {"data": 1}, {"data": 4})
    (slice(2, 4, None), slice(0, 3, None))
    """
    out = []
    for dim, axes in zip(shape, _entries(spec, len(shape), mesh_shape), strict=True):
        parts = math.prod(mesh_shape[a] for a in axes)
        if dim % parts:
            raise ValueError(
                f"dimension of size {dim} does not split evenly over axes {axes} ({parts} parts) "
                f"for spec {spec}"
            )
        step = dim // parts
        i = _index(axes, coords, mesh_shape)
        out.append(slice(i * step, (i + 1) * step))
    return tuple(out)


def local_block(spec, x, coords, mesh_shape):
    """The block of the global array `x` that the process at `coords` holds under `spec`.

    >>> from jax.sharding import PartitionSpec as P
    >>> jaxhc.partition.local_block(P("data"), np.arange(4), {"data": 1}, {"data": 2})
    array([2, 3])
    """
    x = np.asarray(x)
    return x[block_slices(spec, x.shape, coords, mesh_shape)]


def owns_block(spec, ndim, coords, mesh_shape) -> bool:
    """Whether this process holds the canonical copy of its block: coordinate 0 on unnamed axes.

    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = {"data": 2, "tensor": 2}
    >>> [jaxhc.partition.owns_block(P("data"), 1, {"data": d, "tensor": t}, mesh)
    ...  for d in (0, 1) for t in (0, 1)]
    [True, False, True, False]
    """
    named = {a for axes in _entries(spec, ndim, mesh_shape) for a in axes}
    return all(coords[a] == 0 for a in mesh_shape if a not in named)


def global_shape(spec, block_shape, mesh_shape) -> tuple[int, ...]:
    """The shape of the global array whose blocks under `spec` have `block_shape`.

    >>> from jax.sharding import PartitionSpec as P
    >>> spec = P(None, ("data", "tensor"))
    >>> jaxhc.partition.global_shape(spec, (3, 2), {"data": 2, "tensor": 4})
    (3, 16)
    """
    entries = _entries(spec, len(block_shape), mesh_shape)
    return tuple(
        d * math.prod(mesh_shape[a] for a in axes)
        for d, axes in zip(block_shape, entries, strict=True)
    )


def assemble(spec, blocks, all_coords, mesh_shape) -> np.ndarray:
    """The global array from every rank's block (`blocks[r]` is held at `all_coords[r]`).

    >>> from jax.sharding import PartitionSpec as P
    >>> blocks = [np.array([0, 1]), np.array([2, 3])]
    >>> jaxhc.partition.assemble(P("data"), blocks, [{"data": 0}, {"data": 1}], {"data": 2})
    array([0, 1, 2, 3])
    """
    first = np.asarray(blocks[0])
    out = np.empty(global_shape(spec, first.shape, mesh_shape), first.dtype)
    for block, coords in zip(blocks, all_coords, strict=True):
        if owns_block(spec, first.ndim, coords, mesh_shape):
            out[block_slices(spec, out.shape, coords, mesh_shape)] = block
    return out
