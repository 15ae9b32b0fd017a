"""The transport that jaxhc collectives trace with (per thread; XLA unless `use` says otherwise)."""

from __future__ import annotations

import contextlib
import threading

import jax

from jaxhc.transport._base import Transport
from jaxhc.transport.xla import XlaTransport

_STATE = threading.local()


def current() -> Transport:
    """The transport collectives trace with (XLA unless `use` says otherwise)."""
    t = getattr(_STATE, "transport", None)
    if t is None:
        t = _STATE.transport = XlaTransport()
    return t


@contextlib.contextmanager
def use(transport: Transport):
    """Trace jaxhc collectives with `transport` inside this block."""
    prev = getattr(_STATE, "transport", None)
    _STATE.transport = transport
    try:
        yield transport
    finally:
        _STATE.transport = prev


def axis_size(axis_name) -> int:
    """Ranks along `axis_name` (a name or tuple of names) under the current transport.

    Per-shard code should use this and `axis_index` instead of `jax.lax`'s, so that it runs
    unchanged under shard_map (XLA transport) and one process per device (MPI transport).
    """
    return current().axis_size(axis_name)


def axis_index(axis_name) -> jax.Array:
    """This rank's index along `axis_name` under the current transport."""
    return current().axis_index(axis_name)
