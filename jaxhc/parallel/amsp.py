"""An AMSP sharding plan realised on the mesh: the "data" axis as nested sub-axes.

A plan (`jaxhc.model.config.ShardConfig`) gives the group sizes over which the parameters (s_p),
gradients (s_g) and optimizer state (s_os) are split. The data axis is factored into nested
levels, the innermost first (`ShardConfig.resolve`): with one level the axis stays "data"; with
more, the train step runs its `shard_map` over a view of the same devices whose data axis is the
sub-axes ``data.0`` (outermost) ... ``data.<k>`` (innermost), row-major as "data" is, so a data
rank's index over them is its index on "data". A component split over s ranks is split over the
innermost sub-axes whose sizes multiply to s and replicated over the others. Every collective
runs over exactly its group, through jaxhc, so a policy compresses it (a sub-axis without a
policy entry takes the entry of "data").

Gradients are reduce-scattered level by level, innermost first, then all-gathered back over the
levels outside the gradient group, outermost first (over those levels, a hierarchical
all-reduce). Each level adds in rank order, so the result depends on the levels only, not on the
plan: all plans on the same levels give the same bits. The reduce-scatters leave a rank the chunk
whose index has the innermost level's coordinate as its most significant digit (`chunk_index`);
the all-gathers, outermost level first, put the chunks back in order.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import partition
from jaxhc.model.config import MeshConfig


def gathers_per_layer(params: int, gather: str) -> bool:
    """Whether the float32 step gathers sharded parameters (s_p = `params` > 1) layer by layer
    under ``mesh.shard.gather`` `gather`: forward and backward (``layer``), or forward and kept
    (``keep``); ``whole`` gathers the whole chunk once."""
    return params > 1 and gather in ("layer", "keep")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The resolved plan of a mesh config: sizes, sub-axes and each component's group."""

    data: int
    params: int
    grads: int
    optim: int
    axes: tuple[str, ...]  # the data sub-axes, outermost first ("data" alone when flat)
    sizes: tuple[int, ...]  # their sizes
    gather: str = "layer"  # sharded parameters: gathered per layer or whole (`ShardConfig`)

    @classmethod
    def of(cls, mesh_cfg: MeshConfig) -> ShardPlan:
        params, grads, optim, levels = mesh_cfg.shard.resolve(mesh_cfg.data)
        factors = [high // low for low, high in zip([1, *levels], levels, strict=False)]
        sizes = tuple(reversed(factors))
        axes = partition.data_axes(len(sizes))
        return cls(mesh_cfg.data, params, grads, optim, axes, sizes, mesh_cfg.shard.gather)

    @property
    def flat(self) -> bool:
        """Whether the data axis is one level (the mesh itself serves, no view is needed)."""
        return len(self.axes) == 1

    @property
    def data_axis(self):
        """The data axis as collectives and PartitionSpecs name it: "data" or the sub-axes."""
        return self.axes[0] if self.flat else self.axes

    def group(self, size: int) -> tuple[str, ...]:
        """The innermost sub-axes whose sizes multiply to `size` (outermost first)."""
        n, k = 1, len(self.axes)
        while n < size:
            k -= 1
            n *= self.sizes[k]
        if n != size:  # ShardConfig.resolve only admits products of inner levels
            raise ValueError(f"group size {size} is not a product of inner levels {self.sizes}")
        return self.axes[k:]

    @property
    def grad_axes(self) -> tuple[str, ...]:
        return self.group(self.grads)

    @property
    def optim_axes(self) -> tuple[str, ...]:
        return self.group(self.optim)

    @property
    def param_axes(self) -> tuple[str, ...]:
        return self.group(self.params)

    @property
    def sharded_params(self) -> bool:
        """Whether a device holds only its 1/s_p chunk of the parameters (s_p > 1, ZeRO-3)."""
        return self.params > 1

    @property
    def per_layer(self) -> bool:
        """Whether sharded parameters are gathered layer by layer (`gathers_per_layer`)."""
        return gathers_per_layer(self.params, self.gather)

    def view(self, mesh: Mesh) -> Mesh:
        """`mesh` (axes "data", "tensor", "pipe") with "data" factored into the sub-axes."""
        if self.flat:
            return mesh
        devices = np.asarray(mesh.devices)
        shape = (*self.sizes, *devices.shape[1:])
        return Mesh(devices.reshape(shape), (*self.axes, *mesh.axis_names[1:]))

    def view_shape(self, mesh_cfg: MeshConfig) -> dict[str, int]:
        """The axes and sizes of `view`'s mesh (for a launcher that runs one process per device)."""
        return {
            **dict(zip(self.axes, self.sizes, strict=True)),
            "tensor": mesh_cfg.tensor,
            "pipe": mesh_cfg.pipe,
        }

    def on_view(self, specs):
        """PartitionSpecs (a tree of them) with "data" replaced by the view's data axis."""

        def one(spec: P) -> P:
            return P(*(self.data_axis if entry == "data" else entry for entry in spec))

        return jax.tree.map(one, specs, is_leaf=lambda x: isinstance(x, P))

    def mesh_coords(self, view_coords: dict[str, int]) -> dict[str, int]:
        """A device's coordinates on the ("data", "tensor", "pipe") mesh from those on the view."""
        d = 0
        for a, size in zip(self.axes, self.sizes, strict=True):
            d = d * size + int(view_coords[a])
        return {"data": d, "tensor": view_coords["tensor"], "pipe": view_coords["pipe"]}

    # --- per shard ------------------------------------------------------------------------------

    def chunk_index(self, axes: tuple[str, ...]):
        """This rank's chunk among the prod(sizes of `axes`) chunks that the reduce-scatters over
        `axes` (an inner suffix of the sub-axes), innermost first, leave: the innermost
        coordinate is the most significant digit."""
        idx = 0
        for a in reversed(axes):
            idx = idx * jaxhc.axis_size(a) + jaxhc.axis_index(a)
        return idx

    # --- on the host ----------------------------------------------------------------------------

    def coords(self, d: int) -> dict[str, int]:
        """The sub-axis coordinates of data rank `d`."""
        return dict(zip(self.axes, np.unravel_index(d, self.sizes), strict=True))

    def optim_chunk(self, d: int) -> tuple[int, bool]:
        """(index of data rank `d`'s optimizer-state chunk, whether it is its group's first
        replica, the one that writes it to a checkpoint)."""
        return self.chunk_of(d, self.optim_axes)

    def param_chunk(self, d: int) -> tuple[int, bool]:
        """(index of data rank `d`'s parameter chunk, whether it is its group's first replica)."""
        return self.chunk_of(d, self.param_axes)

    def chunk_of(self, d: int, axes: tuple[str, ...]) -> tuple[int, bool]:
        """`chunk_index(axes)` of data rank `d`; whether its coordinates outside `axes` are 0."""
        coords = self.coords(d)
        idx = 0
        for a in reversed(axes):
            idx = idx * self.sizes[self.axes.index(a)] + int(coords[a])
        first = all(coords[a] == 0 for a in self.axes if a not in axes)
        return idx, first
