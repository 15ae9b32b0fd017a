"""MPI transport: one process per device, collectives by mpi4jax on per-axis sub-communicators.

The processes form a grid with the mesh's shape (`ProcessGrid`, `jaxhc.transport._mpi_grid`); a
collective over an axis, or a tuple of axes, runs on the sub-communicator of the ranks that share
every other coordinate.

Every collective here has exactly the `jax.lax` semantics inside `shard_map(check_vma=False)`,
gradients included, and reductions add in rank order as XLA:CPU's in-process all-reduce does, so
results are bitwise identical to the XLA transport on host devices (the raw collectives:
`jaxhc.transport._mpi_raw`; the fused compressed ones: `jaxhc.transport._mpi_fused`). mpi4jax
threads one ordered token through a jitted program, so its MPI calls run in program order on every
rank; a `lax.cond` around collectives is safe when its predicate is agreed (`all_agree`), as
jaxhc's are.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxhc.transport import _mpi_fused
from jaxhc.transport import _mpi_raw as raw
from jaxhc.transport._base import Transport
from jaxhc.transport._mpi_grid import ProcessGrid, mpi

__all__ = ["MpiTransport", "ProcessGrid"]


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
    # the collectives `fused` may take (`fused_psum`, `fused_psum_scatter`, `fused_all_gather`)
    FUSED_OPS = ("psum", "psum_scatter", "all_gather")

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

        return mpi4jax.allreduce(flag, op=mpi().MIN, comm=self.grid.comm(axis_name)) > 0

    def all_to_all_rows(self, rows, axis_name):
        return raw.alltoall(rows, self.grid.comm(axis_name))

    def all_gather_rows(self, row, axis_name):
        return raw.allgather(row, self.grid.comm(axis_name))

    def fused(self, codec, dtype, axis_name) -> bool:
        return self.axis_size(axis_name) > 1 and _mpi_fused.supports(codec, dtype)

    @staticmethod
    def fuses(codec, dtype, op: str = "psum", feedback: bool = False) -> bool:
        """Whether the native engine runs `op` (one of `FUSED_OPS`) of `dtype` messages under
        `codec` (None: plain) as one fused call, whether or not this build has the engine: the
        rule `fused` applies, and with `feedback` (a gradient reduce-scatter that carries an
        error-feedback residual: the only call with a residual the engine fuses) the rule
        `fused_feedback` applies. A call it fuses is one the transport can start
        (`can_start`). `jaxhc.plan` prices it for a cluster that has the engine.

        >>> from jaxhc.codecs import parse
        >>> [MpiTransport.fuses(parse(spec), "float32") for spec in ("zfp:8", "q8:sr")]
        [True, False]
        >>> [MpiTransport.fuses(parse("zfp:8"), "float32", op, feedback=True)
        ...  for op in ("psum_scatter", "psum")]
        [True, False]
        """
        if op not in MpiTransport.FUSED_OPS:
            return False
        if feedback:
            return op == "psum_scatter" and _mpi_fused.feedback_fusable(codec, dtype)
        return _mpi_fused.fusable(codec, dtype)

    def fused_psum(self, x, axis_name, codec):
        y, wire, fell = _mpi_fused.psum(x.reshape(-1), self.grid.comm(axis_name), codec)
        return y.reshape(x.shape), wire, fell

    def fused_psum_scatter(self, rows, axis_name, codec):
        return _mpi_fused.psum_scatter(rows.reshape(-1), self.grid.comm(axis_name), codec)

    def fused_feedback(self, codec, dtype, axis_name) -> bool:
        return self.axis_size(axis_name) > 1 and _mpi_fused.feedback_supported(codec, dtype)

    def fused_psum_scatter_feedback(self, rows, residual, axis_name, codec):
        comm = self.grid.comm(axis_name)
        y, new, wire, fell = _mpi_fused.psum_scatter_feedback(
            rows.reshape(-1), residual.reshape(-1), comm, codec
        )
        return y, new.reshape(rows.shape), wire, fell

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
        return jax.tree.map(lambda a: raw.ppermute(a, self, axes, raw.perm_pairs(perm)), x)

    def ppermute_index(self, axis_name):
        return self.axis_index(self.grid.mesh_order(axis_name))

    def psum(self, x, axis_name):
        return jax.tree.map(lambda a: raw.psum(a, self, axis_name), x)

    def all_gather(self, x, axis_name, *, axis=0, tiled=False, **kw):
        kw.pop("to", None)  # no varying types outside shard_map
        if kw.get("axis_index_groups") is not None:
            raise NotImplementedError("MpiTransport.all_gather: axis_index_groups")
        return jax.tree.map(lambda a: raw.all_gather(a, self, axis_name, axis, tiled), x)

    def psum_scatter(self, x, axis_name, *, scatter_dimension=0, tiled=False):
        return jax.tree.map(
            lambda a: raw.psum_scatter(a, self, axis_name, scatter_dimension, tiled), x
        )

    def all_to_all(self, x, axis_name, split_axis, concat_axis, *, tiled=False):
        return jax.tree.map(
            lambda a: raw.all_to_all(a, self, axis_name, split_axis, concat_axis, tiled), x
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
