"""The raw collectives of the MPI transport: mpi4jax calls on the grid's sub-communicators, with
exactly the `jax.lax` semantics inside `shard_map(check_vma=False)`, gradients included.

`allgather` and `alltoall` move rows (mpi4jax on wire-safe dtypes); `psum`, `all_gather`,
`psum_scatter`, `all_to_all` and `ppermute` are the `jax.lax` collectives of `t`, the transport
(its grid and ``psum`` mode), that `MpiTransport`'s methods call. Reductions add in rank order as
XLA:CPU's in-process all-reduce does, so results are bitwise identical to the XLA transport on
host devices; where the native engine takes the dtype, the plain (codec-less) fused call of
`_mpi_fused` does the same in one call.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxhc._checks import split_dim
from jaxhc._sum import accumulator, sum_in_rank_order
from jaxhc.transport import _mpi_fused
from jaxhc.transport._mpi_grid import mpi

if TYPE_CHECKING:
    from jaxhc.transport.mpi import MpiTransport

__all__ = [
    "all_gather",
    "all_to_all",
    "allgather",
    "alltoall",
    "perm_pairs",
    "ppermute",
    "psum",
    "psum_scatter",
]

# dtypes mpi4jax moves as themselves; others travel as unsigned words of the same width.
_MPI_DTYPES = frozenset(
    np.dtype(d)
    for d in ("float32", "float64", "complex64", "complex128", "int8", "int16", "int32", "int64")
    + ("uint8", "uint16", "uint32", "uint64")
)
_WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
_TAG = 17


# --- data movement: mpi4jax primitives on wire-safe dtypes ---------------------------------------


def _to_wire(x):
    dt = jnp.dtype(x.dtype)
    if dt in _MPI_DTYPES:
        return x, lambda y: y
    if dt == jnp.bool_:
        return x.astype(jnp.uint8), lambda y: y.astype(jnp.bool_)
    word = _WORDS[dt.itemsize]
    return lax.bitcast_convert_type(x, word), lambda y: lax.bitcast_convert_type(y, dt)


def allgather(x, comm):
    """(P, *x.shape): row j is rank j's x."""
    if comm.Get_size() == 1:
        return x[None]
    import mpi4jax

    wire, back = _to_wire(x)
    return back(mpi4jax.allgather(wire, comm=comm))


def alltoall(rows, comm):
    """rows[j] goes to rank j; row j of the result came from rank j."""
    if comm.Get_size() == 1:
        return rows
    import mpi4jax

    wire, back = _to_wire(rows)
    return back(mpi4jax.alltoall(wire, comm=comm))


def perm_pairs(perm) -> tuple[tuple[int, int], ...]:
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

    MPI = mpi()
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
    return sum_in_rank_order(alltoall(rows, comm), wide16=False)


# --- raw collectives with jax.lax semantics and shard_map(check_vma=False) gradients ------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def psum(x, t: MpiTransport, axis_name):
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
        y = mpi4jax.allreduce(x.astype(acc_dtype), op=mpi().SUM, comm=comm)
        return y.astype(x.dtype)
    n = x.size
    per = -(-max(n, 1) // parts)
    rows = jnp.pad(x.reshape(-1), (0, parts * per - n)).reshape(parts, per)
    mine = _reduce_scatter_rows(rows, comm)
    return allgather(mine, comm).reshape(-1)[:n].reshape(x.shape)


psum.defvjp(
    lambda x, t, ax: (psum(x, t, ax), None),
    lambda t, ax, _, ct: (psum(ct, t, ax),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def all_gather(x, t: MpiTransport, axis_name, axis, tiled):
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
        got = allgather(x, comm)  # (P, *x.shape)
    out = jnp.moveaxis(got, 0, axis)
    if tiled:
        parts = got.shape[0]
        out = out.reshape(x.shape[:axis] + (parts * x.shape[axis],) + x.shape[axis + 1 :])
    return out


def _all_gather_bwd(t, axis_name, axis, tiled, _, ct):
    return (psum_scatter(ct, t, axis_name, axis % ct.ndim, tiled),)


all_gather.defvjp(
    lambda x, t, ax, axis, tiled: (all_gather(x, t, ax, axis, tiled), None), _all_gather_bwd
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def psum_scatter(x, t: MpiTransport, axis_name, dim, tiled):
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


psum_scatter.defvjp(
    lambda x, t, ax, dim, tiled: (psum_scatter(x, t, ax, dim, tiled), None),
    lambda t, ax, dim, tiled, _, ct: (all_gather(ct, t, ax, dim, tiled),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def all_to_all(x, t: MpiTransport, axis_name, split_axis, concat_axis, tiled):
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
    got = alltoall(chunks, t.grid.comm(axis_name))
    out = jnp.moveaxis(got, 0, concat_axis)
    shape = got.shape[1:]
    return out.reshape(
        shape[:concat_axis] + (parts * shape[concat_axis],) + shape[concat_axis + 1 :]
    )


all_to_all.defvjp(
    lambda x, t, ax, s, c, tiled: (all_to_all(x, t, ax, s, c, tiled), None),
    lambda t, ax, s, c, tiled, _, ct: (all_to_all(ct, t, ax, c, s, tiled),),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def ppermute(x, t: MpiTransport, axis_name, perm):
    x = jnp.asarray(x)
    return _sendrecv(x, t.grid.comm(axis_name), t.grid.axis_index(axis_name), perm)


ppermute.defvjp(
    lambda x, t, ax, perm: (ppermute(x, t, ax, perm), None),
    lambda t, ax, perm, _, ct: (ppermute(ct, t, ax, tuple((d, s) for s, d in perm)),),
)
