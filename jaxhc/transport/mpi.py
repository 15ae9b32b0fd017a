"""MPI transport: one process per device, collectives by mpi4jax on per-axis sub-communicators.

The processes form a grid with the mesh's shape: rank r has the row-major coordinates of r, as
device r has in a `Mesh` of `np.array(devices).reshape(shape)`. A collective over an axis, or a
tuple of axes, runs on the sub-communicator of the ranks that share every other coordinate; a rank's
index in it is its row-major index over the named axes in the order given, as `jax.lax.axis_index`
and the gathers count (ppermute alone numbers a tuple in mesh order, as `jax.lax.ppermute` does).

Every collective here has exactly the `jax.lax` semantics inside `shard_map(check_vma=False)`,
gradients included, and reductions add in rank order as XLA:CPU's in-process all-reduce does, so
results are bitwise identical to the XLA transport on host devices. mpi4jax threads one ordered
token through a jitted program, so its MPI calls run in program order on every rank; a `lax.cond`
around collectives is safe when its predicate is agreed (`all_agree`), as jaxhc's are.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxhc._checks import split_dim
from jaxhc._compat import axis_tuple
from jaxhc._sum import accumulator, sum_in_rank_order
from jaxhc.transport import _mpi_fused
from jaxhc.transport._base import Transport

# dtypes mpi4jax moves as themselves; others travel as unsigned words of the same width.
_MPI_DTYPES = frozenset(
    np.dtype(d)
    for d in ("float32", "float64", "complex64", "complex128", "int8", "int16", "int32", "int64")
    + ("uint8", "uint16", "uint32", "uint64")
)
_WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
_TAG = 17


def _mpi():
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
        MPI = _mpi()
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


class MpiTransport(Transport):
    """jaxhc's transport over MPI: trace a per-process jit under it (`jaxhc.context.use`).

    ``psum="exact"`` (default) reduces as a reduce-scatter (`alltoall`) whose owner adds the P
    pieces in rank order, then an `allgather`: the same bytes on the wire as a ring all-reduce, and
    bitwise the result of XLA:CPU's all-reduce (bfloat16 adds in float32, as XLA:CPU does).
    ``psum="allreduce"`` calls `MPI_Allreduce`; Open MPI then picks the summation order by message
    size and process count, so float results can differ from XLA's in the last bits.

    >>> from jaxhc.transport import MpiTransport, ProcessGrid
    >>> mpi = MpiTransport(ProcessGrid({"data": 1}))   # one process: a mesh of one rank
    >>> mpi.name, mpi.axis_size("data")
    ('mpi', 1)
    """

    name = "mpi"
    # raw bytes per pipelined segment of a compressed fused call (psum, psum_scatter,
    # all_gather): its segments are encoded, sent and decoded in a pipeline
    SEGMENT_BYTES = _mpi_fused.SEGMENT_BYTES

    def __init__(self, grid: ProcessGrid, *, psum: str = "exact"):
        import mpi4jax  # noqa: F401  (imports fail early, with mpi4jax's own message)

        _allow_in_remat()
        if psum not in ("exact", "allreduce"):
            raise ValueError(f"psum={psum!r} must be 'exact' or 'allreduce'")
        self.grid = grid
        self.psum_mode = psum

    def axis_size(self, axis_name) -> int:
        return self.grid.axis_size(axis_name)

    def axis_index(self, axis_name) -> jax.Array:
        # Known when tracing here, but a runtime value (from the partition id) in XLA's SPMD
        # module. Hidden from constant folding, it leaves XLA:CPU the same module to fuse (no
        # branch on the pipeline stage folded away), so the float math rounds as on the XLA
        # transport: training losses match bit for bit (tests/test_train_mpi.py).
        index = jnp.asarray(self.grid.axis_index(axis_name), jnp.int32)
        return jax.lax.optimization_barrier(index)

    def all_agree(self, flag, axis_name):
        flag = jnp.asarray(flag).astype(jnp.int32)
        if self.axis_size(axis_name) == 1:
            return flag > 0
        import mpi4jax

        return mpi4jax.allreduce(flag, op=_mpi().MIN, comm=self.grid.comm(axis_name)) > 0

    def all_to_all_rows(self, rows, axis_name):
        return _alltoall(rows, self.grid.comm(axis_name))

    def all_gather_rows(self, row, axis_name):
        return _allgather(row, self.grid.comm(axis_name))

    def fused(self, codec, dtype, axis_name) -> bool:
        return self.axis_size(axis_name) > 1 and _mpi_fused.supports(codec, dtype)

    def fused_psum(self, x, axis_name, codec):
        y, wire, fell = _mpi_fused.psum(x.reshape(-1), self.grid.comm(axis_name), codec)
        return y.reshape(x.shape), wire, fell

    def fused_psum_scatter(self, rows, axis_name, codec):
        return _mpi_fused.psum_scatter(rows.reshape(-1), self.grid.comm(axis_name), codec)

    def fused_all_gather(self, x, axis_name, codec):
        y, wire, fell = _mpi_fused.all_gather(x.reshape(-1), self.grid.comm(axis_name), codec)
        return y.reshape((self.axis_size(axis_name),) + x.shape), wire, fell

    def can_start(self, codec, dtype, axis_name) -> bool:
        return self.fused(codec, dtype, axis_name) and _mpi_fused.async_ready()

    def start(self, op, x, axis_name, codec):
        return _mpi_fused.start(op, x.reshape(-1), self.grid.async_comm(axis_name), codec)

    def done(self, handle, size, dtype):
        return _mpi_fused.done(handle, size, dtype)

    def ppermute(self, x, axis_name, perm):
        axes = self.grid.mesh_order(axis_name)  # as jax.lax.ppermute numbers a tuple of axes
        return jax.tree.map(lambda a: _ppermute(a, self, axes, _perm(perm)), x)

    def ppermute_index(self, axis_name):
        return self.axis_index(self.grid.mesh_order(axis_name))

    def psum(self, x, axis_name):
        return jax.tree.map(lambda a: _psum(a, self, axis_name), x)

    def all_gather(self, x, axis_name, *, axis=0, tiled=False, **kw):
        kw.pop("to", None)  # no varying types outside shard_map
        if kw.get("axis_index_groups") is not None:
            raise NotImplementedError("MpiTransport.all_gather: axis_index_groups")
        return jax.tree.map(lambda a: _all_gather(a, self, axis_name, axis, tiled), x)

    def psum_scatter(self, x, axis_name, *, scatter_dimension=0, tiled=False):
        return jax.tree.map(
            lambda a: _psum_scatter(a, self, axis_name, scatter_dimension, tiled), x
        )

    def all_to_all(self, x, axis_name, split_axis, concat_axis, *, tiled=False):
        return jax.tree.map(
            lambda a: _all_to_all(a, self, axis_name, split_axis, concat_axis, tiled), x
        )


@functools.cache
def _allow_in_remat() -> bool:
    """Let mpi4jax's ordered effect inside `jax.checkpoint` (a model's remat'd blocks).

    jax refuses effects in remat because recomputation replays them; replaying a collective is
    safe here since every rank replays the same calls in the same order (the XLA transport's
    collectives are recomputed the same way). mpi4jax only registers it for control flow and
    custom derivatives. Both names are private: if they move, remat over MPI raises again.
    """
    try:
        from jax._src import effects
        from mpi4jax._src.utils import OrderedMPIEffect

        effects.remat_allowed_effects.add_type(OrderedMPIEffect)
    except (ImportError, AttributeError):  # pragma: no cover - other jax / mpi4jax versions
        return False
    return True


# --- data movement: mpi4jax primitives on wire-safe dtypes ---------------------------------------


def _to_wire(x):
    dt = jnp.dtype(x.dtype)
    if dt in _MPI_DTYPES:
        return x, lambda y: y
    if dt == jnp.bool_:
        return x.astype(jnp.uint8), lambda y: y.astype(jnp.bool_)
    word = _WORDS[dt.itemsize]
    return lax.bitcast_convert_type(x, word), lambda y: lax.bitcast_convert_type(y, dt)


def _allgather(x, comm):
    """(P, *x.shape): row j is rank j's x."""
    if comm.Get_size() == 1:
        return x[None]
    import mpi4jax

    wire, back = _to_wire(x)
    return back(mpi4jax.allgather(wire, comm=comm))


def _alltoall(rows, comm):
    """rows[j] goes to rank j; row j of the result came from rank j."""
    if comm.Get_size() == 1:
        return rows
    import mpi4jax

    wire, back = _to_wire(rows)
    return back(mpi4jax.alltoall(wire, comm=comm))


def _perm(perm) -> tuple[tuple[int, int], ...]:
    return tuple((int(s), int(d)) for s, d in perm)


def _sendrecv(x, comm, me, perm):
    """`lax.ppermute` on one rank: send to my destination, get from my source (either optional)."""
    dest = dict(perm).get(me)
    src = {d: s for s, d in perm}.get(me)
    if src == me and dest == me:
        return x
    if dest is None and src is None:
        return jnp.zeros_like(x)
    import mpi4jax

    MPI = _mpi()
    wire, back = _to_wire(x)
    got = mpi4jax.sendrecv(
        wire,
        jnp.zeros_like(wire),
        MPI.PROC_NULL if src is None else src,
        MPI.PROC_NULL if dest is None else dest,
        sendtag=_TAG,
        recvtag=_TAG,
        comm=comm,
    )
    # With no source the receive buffer is not written: lax.ppermute gives zeros there.
    return back(got) if src is not None else jnp.zeros_like(x)


def _reduce_scatter_rows(rows, comm):
    """rows (P, m): rank j gets the rank-ordered sum of every rank's rows[j]."""
    return sum_in_rank_order(_alltoall(rows, comm), wide16=False)


# --- raw collectives with jax.lax semantics and shard_map(check_vma=False) gradients ------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _psum(x, t: MpiTransport, axis_name):
    x = jnp.asarray(x)
    parts = t.axis_size(axis_name)
    if parts == 1:
        return x
    comm = t.grid.comm(axis_name)
    if t.psum_mode == "exact" and _mpi_fused.supports(None, x.dtype):
        return _mpi_fused.psum(x.reshape(-1), comm, None)[0].reshape(x.shape)
    if t.psum_mode == "allreduce" and jnp.dtype(x.dtype) != jnp.bool_:
        import mpi4jax

        acc_dtype = accumulator(x.dtype, wide16=False)
        y = mpi4jax.allreduce(x.astype(acc_dtype), op=_mpi().SUM, comm=comm)
        return y.astype(x.dtype)
    n = x.size
    per = -(-max(n, 1) // parts)
    rows = jnp.pad(x.reshape(-1), (0, parts * per - n)).reshape(parts, per)
    mine = _reduce_scatter_rows(rows, comm)
    return _allgather(mine, comm).reshape(-1)[:n].reshape(x.shape)


_psum.defvjp(
    lambda x, t, ax: (_psum(x, t, ax), None),
    lambda t, ax, _, ct: (_psum(ct, t, ax),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _all_gather(x, t: MpiTransport, axis_name, axis, tiled):
    x = jnp.asarray(x)
    ndim = x.ndim + (0 if tiled else 1)
    if not -ndim <= axis < ndim:
        raise ValueError(f"all_gather: axis {axis} out of range for shape {x.shape}")
    axis %= ndim
    comm = t.grid.comm(axis_name)
    if comm.Get_size() > 1 and _mpi_fused.supports(None, x.dtype):
        got = _mpi_fused.all_gather(x.reshape(-1), comm, None)[0]
        got = got.reshape((comm.Get_size(),) + x.shape)
    else:
        got = _allgather(x, comm)  # (P, *x.shape)
    out = jnp.moveaxis(got, 0, axis)
    if tiled:
        parts = got.shape[0]
        out = out.reshape(x.shape[:axis] + (parts * x.shape[axis],) + x.shape[axis + 1 :])
    return out


def _all_gather_bwd(t, axis_name, axis, tiled, _, ct):
    return (_psum_scatter(ct, t, axis_name, axis % ct.ndim, tiled),)


_all_gather.defvjp(
    lambda x, t, ax, axis, tiled: (_all_gather(x, t, ax, axis, tiled), None), _all_gather_bwd
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _psum_scatter(x, t: MpiTransport, axis_name, dim, tiled):
    x = jnp.asarray(x)
    parts = t.axis_size(axis_name)
    dim = split_dim(x, dim, tiled, parts, "psum_scatter", "scatter_dimension")
    moved = jnp.moveaxis(x, dim, 0)
    chunk = (moved.shape[0] // parts,) + moved.shape[1:] if tiled else moved.shape[1:]
    if parts == 1:
        mine = moved.reshape(chunk)
    else:
        rows, comm = moved.reshape(parts, -1), t.grid.comm(axis_name)
        if _mpi_fused.supports(None, x.dtype):
            mine = _mpi_fused.psum_scatter(rows.reshape(-1), comm, None)[0]
        else:
            mine = _reduce_scatter_rows(rows, comm)
        mine = mine.reshape(chunk)
    return jnp.moveaxis(mine, 0, dim) if tiled else mine


_psum_scatter.defvjp(
    lambda x, t, ax, dim, tiled: (_psum_scatter(x, t, ax, dim, tiled), None),
    lambda t, ax, dim, tiled, _, ct: (_all_gather(ct, t, ax, dim, tiled),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _all_to_all(x, t: MpiTransport, axis_name, split_axis, concat_axis, tiled):
    x = jnp.asarray(x)
    parts = t.axis_size(axis_name)
    for name, a in (("split_axis", split_axis), ("concat_axis", concat_axis)):
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"all_to_all: {name} {a} out of range for {x.shape}")
    split_axis, concat_axis = split_axis % x.ndim, concat_axis % x.ndim
    size = x.shape[split_axis]
    if (tiled and size % parts) or (not tiled and size != parts):
        need = f"a multiple of {parts}" if tiled else f"equal to the axis size {parts}"
        raise ValueError(f"all_to_all: split axis {split_axis} of {x.shape} must be {need}")
    # The same reshaping as jax.lax.all_to_all around its tiled primitive.
    if not tiled:
        if split_axis < concat_axis:
            concat_axis += 1
            x = lax.expand_dims(x, (concat_axis,))
        elif split_axis > concat_axis:
            x = lax.expand_dims(x, (concat_axis,))
            split_axis += 1
    out = _all_to_all_tiled(x, t, axis_name, split_axis, concat_axis, parts)
    if not tiled and split_axis != concat_axis:
        out = lax.squeeze(out, (split_axis,))
    return out


def _all_to_all_tiled(x, t, axis_name, split_axis, concat_axis, parts):
    """XLA's AllToAll: chunk j along split_axis goes to rank j; chunks arrive along concat_axis."""
    if parts == 1:
        return x
    moved = jnp.moveaxis(x, split_axis, 0)
    chunks = moved.reshape((parts, moved.shape[0] // parts) + moved.shape[1:])
    chunks = jnp.moveaxis(chunks, 1, split_axis + 1)  # (P, *chunk shape in x's axis order)
    got = _alltoall(chunks, t.grid.comm(axis_name))
    out = jnp.moveaxis(got, 0, concat_axis)
    shape = got.shape[1:]
    return out.reshape(
        shape[:concat_axis] + (parts * shape[concat_axis],) + shape[concat_axis + 1 :]
    )


_all_to_all.defvjp(
    lambda x, t, ax, s, c, tiled: (_all_to_all(x, t, ax, s, c, tiled), None),
    lambda t, ax, s, c, tiled, _, ct: (_all_to_all(ct, t, ax, c, s, tiled),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _ppermute(x, t: MpiTransport, axis_name, perm):
    x = jnp.asarray(x)
    return _sendrecv(x, t.grid.comm(axis_name), t.grid.axis_index(axis_name), perm)


_ppermute.defvjp(
    lambda x, t, ax, perm: (_ppermute(x, t, ax, perm), None),
    lambda t, ax, perm, _, ct: (_ppermute(ct, t, ax, tuple((d, s) for s, d in perm)),),
)
