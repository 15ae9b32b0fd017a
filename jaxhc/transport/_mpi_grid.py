"""The MPI processes of a run arranged as a mesh (`ProcessGrid`): each rank's coordinates and the
sub-communicators of every tuple of axes, which `jaxhc.transport.mpi` runs its collectives on.

The processes form a grid with the mesh's shape: rank r has the row-major coordinates of r, as
device r has in a `Mesh` of `np.array(devices).reshape(shape)`. A collective over an axis, or a
tuple of axes, runs on the sub-communicator of the ranks that share every other coordinate; a rank's
index in it is its row-major index over the named axes in the order given, as `jax.lax.axis_index`
and the gathers count (ppermute alone numbers a tuple in mesh order, as `jax.lax.ppermute` does).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np

from jaxhc._compat import axis_tuple

__all__ = ["ProcessGrid", "mpi"]


def mpi():
    """mpi4py's `MPI` (imported when first needed)."""
    from mpi4py import MPI

    return MPI


class ProcessGrid:
    """The MPI processes arranged as a mesh: coordinates and one communicator per tuple of axes.

    Communicators for every ordered tuple of distinct axes are split from `comm` up front (a
    collective call on all ranks), so that tracing never needs a collective MPI call.

    >>> from jaxhc.transport import ProcessGrid
    >>> ProcessGrid({"data": 1}).coords        # one process; under mpirun -np 4, {"data": 2,
    {'data': 0}
    >>> # "tensor": 2} gives rank 2 the coordinates {'data': 1, 'tensor': 0}
    """

    def __init__(self, mesh_shape: Mapping[str, int], comm=None):
        MPI = mpi()
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.axis_names = tuple(mesh_shape)
        self.shape = tuple(int(mesh_shape[a]) for a in self.axis_names)
        if not self.axis_names or any(s < 1 for s in self.shape):
            raise ValueError(f"mesh shape {dict(mesh_shape)} needs one or more axes of size >= 1")
        size, need = self.world.Get_size(), math.prod(self.shape)
        if size != need:
            raise ValueError(
                f"the mesh {dict(mesh_shape)} has {need} devices but the MPI job has {size} "
                f"processes: start it with `mpirun -np {need}` (one process per device)"
            )
        self.rank = self.world.Get_rank()
        self.size = size
        self.coords = dict(
            zip(
                self.axis_names,
                (int(i) for i in np.unravel_index(self.rank, self.shape)),
                strict=True,
            )
        )
        # Python-level checks (shape agreement, fetch) use their own communicator, never mpi4jax's.
        self.control = self.world.Dup()
        self._comms, self._async = {}, {}
        for k in range(1, len(self.axis_names) + 1):
            for axes in itertools.permutations(self.axis_names, k):
                others = [a for a in self.axis_names if a not in axes]
                color = self._linear(others)
                self._comms[axes] = self.world.Split(color, self._linear(axes))
                # The started calls' own: the progress thread's messages and agreements then
                # never meet the calling thread's on the same communicator.
                self._async[axes] = self._comms[axes].Dup()

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.shape, strict=True))

    def axes(self, axis_name) -> tuple[str, ...]:
        axes = axis_tuple(axis_name)
        unknown = [a for a in axes if a not in self.axis_names]
        if unknown or len(set(axes)) != len(axes):
            raise NameError(
                f"axis name {axis_name!r} is not a mesh axis (or repeats one); "
                f"the mesh has axes {self.axis_names}"
            )
        return axes

    def axis_size(self, axis_name) -> int:
        return math.prod(self.shape[self.axis_names.index(a)] for a in self.axes(axis_name))

    def axis_index(self, axis_name) -> int:
        return self._linear(self.axes(axis_name))

    def mesh_order(self, axis_name) -> tuple[str, ...]:
        """The axes of `axis_name` in mesh order."""
        axes = self.axes(axis_name)
        return tuple(a for a in self.axis_names if a in axes)

    def comm(self, axis_name):
        return self._comms[self.axes(axis_name)]

    def async_comm(self, axis_name):
        """The communicator of `axis_name`'s started calls (`MpiTransport.start`), a duplicate
        of `comm`'s that nothing else uses."""
        return self._async[self.axes(axis_name)]

    def _linear(self, axes) -> int:
        idx = 0
        for a in axes:
            idx = idx * self.shape[self.axis_names.index(a)] + self.coords[a]
        return idx

    def free(self) -> None:
        """Release the communicators (collective; optional, MPI_Finalize releases them too)."""
        for c in (*self._comms.values(), *self._async.values()):
            c.Free()
        self.control.Free()
        self._comms.clear()
        self._async.clear()
