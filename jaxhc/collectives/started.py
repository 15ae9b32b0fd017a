"""Collectives started in one place and finished in another, the bytes moving in between.

``psum_scatter_start`` (or ``psum_start``, ``all_gather_start``) hands the call to the transport
and returns a `Started` at once; ``psum_scatter_done`` (``psum_done``, ``all_gather_done``) gives
its result, the values the synchronous `jaxhc.psum_scatter` (`jaxhc.psum`, `jaxhc.all_gather`) of
the same input gives, bit for bit, and records it in the ledger as that call does. On the MPI
transport the call runs on the engine's progress thread for its communicator meanwhile
(ffi/mpi/queue.h), so what the program computes between the two overlaps the communication;
`can_start` says whether the transport takes the call (the XLA transport never does: its
collectives are XLA's, scheduled by XLA).

A `Started` is a pytree whose one leaf is its handle (float32 [1]): it can leave a `lax.scan` as
an output or a custom_vjp backward as a cotangent; `Started.like` puts a handle back into the
description of a started call. The calls run in the order they were started, on every rank.

>>> s = started.psum_scatter_start(g, "data", kind="grad")  # doctest: +SKIP
>>> ...  # compute that does not need the reduced gradients
>>> mine = started.psum_scatter_done(s)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp

from jaxhc.codecs import Codec, CodecLike
from jaxhc.collectives import _common as c
from jaxhc.collectives import _feedback as ef
from jaxhc.collectives import volume
from jaxhc.transport import current as transport

__all__ = [
    "Started",
    "all_gather_done",
    "all_gather_start",
    "can_start",
    "psum_done",
    "psum_scatter_done",
    "psum_scatter_start",
    "psum_start",
]


def _static(default):
    return field(default=default, metadata={"static": True})


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Started:
    """A started call: its handle and (static) what `done` needs to finish it."""

    handle: jax.Array
    op: str = _static("psum")
    axis_name: object = _static(None)
    kind: str | None = _static(None)
    codec: Codec | None = _static(None)
    shape: tuple = _static(())
    dtype: object = _static(jnp.float32)
    raw: float = _static(0.0)
    wire: float | None = _static(None)
    residual: tuple | None = _static(None)  # error feedback: the residual's shape

    def like(self, handle: jax.Array) -> Started:
        """The same call's description with `handle` (one of its kind, e.g. a scan's slice)."""
        return replace(self, handle=handle)


def can_start(
    x, axis_name, *, codec: CodecLike = None, policy=None, kind=None, feedback: bool = False
) -> bool:
    """Whether `psum_start` / `psum_scatter_start` / `all_gather_start` of `x` (an array or its
    shape and dtype) overlap with what follows them on the current transport (codec chosen as
    the synchronous call chooses it); `feedback`: a `psum_scatter_start` with a residual."""
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    t = transport()
    ok = t.can_start(chosen, x.dtype, axis_name)
    return ok and (not feedback or t.fused_feedback(chosen, x.dtype, axis_name))


def _start(op, x, axis_name, codec, policy, kind, raw, wire=None, shape=None, residual=None):
    feedback = residual is not None
    if not can_start(x, axis_name, codec=codec, policy=policy, kind=kind, feedback=feedback):
        raise ValueError(
            f"jaxhc {op} of {x.shape} {x.dtype} over {axis_name!r}"
            + (" with a residual" if feedback else "")
            + f" cannot be started on the {transport().name} transport (check can_start first)"
        )
    chosen = c.resolve(x, axis_name, codec, policy, kind)
    parts = transport().axis_size(axis_name)
    flat = x.reshape(-1)
    if feedback:  # the engine's one input: the values, then the residual
        ef.check(x, residual, "psum_scatter_start")
        flat = jnp.concatenate([flat, residual.reshape(-1)])
    handle = transport().start(op + ("_ef" if feedback else ""), flat, axis_name, chosen)
    if shape is None:
        shape = (x.shape[0] // parts, *x.shape[1:]) if op == "psum_scatter" else x.shape
    dtype, full = jnp.dtype(x.dtype), tuple(x.shape) if feedback else None
    return Started(handle, op, axis_name, kind, chosen, shape, dtype, raw, wire, full)


def _done(s: Started):
    size = math.prod(s.shape)
    more = 0 if s.residual is None else math.prod(s.residual)
    out, wire, fell = transport().done(s.handle, size + more, s.dtype)
    out, new = out[:size].reshape(s.shape), out[size:]
    if s.codec is None:  # a plain call is recorded with the bytes the plain collective counts
        wire, fell = s.raw if s.wire is None else s.wire, False
    out = c.record(s.axis_name, s.kind, s.raw, wire, fell, anchor=out)
    return out if s.residual is None else (out, new.reshape(s.residual))


def psum_scatter_start(
    x, axis_name, *, codec: CodecLike = None, policy=None, kind=None, residual=None
):
    """Start ``jaxhc.psum_scatter(x, axis_name, tiled=True, ...)`` (scatter dimension 0); with
    `residual` (error feedback, float32 `x`), its done gives (the slice, the new residual)."""
    x = c.as_array(x)
    parts = transport().axis_size(axis_name)
    if x.ndim == 0 or x.shape[0] % parts:
        raise ValueError(
            f"psum_scatter_start: dimension 0 of {x.shape} must be a multiple of the axis size "
            f"{parts} of {axis_name!r}"
        )
    raw = volume.raw("psum_scatter", parts, c.nbytes(x))
    return _start("psum_scatter", x, axis_name, codec, policy, kind, raw, residual=residual)


def psum_scatter_done(started: Started):
    """This rank's reduced slice of the started `psum_scatter_start` (with a residual: (that
    slice, the new residual))."""
    return _done(started)


def psum_start(x, axis_name, *, codec: CodecLike = None, policy=None, kind=None):
    """Start ``jaxhc.psum(x, axis_name, ...)`` of one array."""
    x = c.as_array(x)
    parts = transport().axis_size(axis_name)
    ring = volume.raw("psum", parts, c.nbytes(x))
    return _start("psum", x, axis_name, codec, policy, kind, ring, ring)


def psum_done(started: Started) -> jax.Array:
    """The sum of the started `psum_start`, on every rank."""
    return _done(started)


def all_gather_start(x, axis_name, *, tiled=False, codec: CodecLike = None, policy=None, kind=None):
    """Start ``jaxhc.all_gather(x, axis_name, tiled=tiled, ...)`` (gathered along dimension 0)."""
    x = c.as_array(x)
    parts = transport().axis_size(axis_name)
    if tiled and x.ndim == 0:
        raise ValueError(f"all_gather_start: a tiled gather needs an array, not a scalar {x.shape}")
    shape = (parts * x.shape[0], *x.shape[1:]) if tiled else (parts, *x.shape)
    raw = volume.raw("all_gather", parts, c.nbytes(x))  # as the synchronous call counts
    return _start("all_gather", x, axis_name, codec, policy, kind, raw, shape=shape)


def all_gather_done(started: Started) -> jax.Array:
    """Every rank's block of the started `all_gather_start`, in rank order, on every rank."""
    return _done(started)
