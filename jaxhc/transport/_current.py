"""The transport that jaxhc collectives trace with: the transport of `jaxhc.context`."""

from __future__ import annotations

import contextlib

import jax

from jaxhc import context
from jaxhc.transport._base import Transport


def current() -> Transport:
    """The transport collectives trace with (XLA unless `use` says otherwise)."""
    return context.transport()


@contextlib.contextmanager
def use(transport: Transport):
    """Trace jaxhc collectives with `transport` inside this block (yields it): the same as
    ``jaxhc.context.use(transport=transport)``."""
    with context.use(transport=transport):
        yield transport


def axis_size(axis_name) -> int:
    """Ranks along `axis_name` (a name or tuple of names) under the current transport.

    Per-shard code should use this and `axis_index` instead of `jax.lax`'s, so that it runs
    unchanged under shard_map (XLA transport) and one process per device (MPI transport).
    """
    return current().axis_size(axis_name)


def axis_index(axis_name) -> jax.Array:
    """This rank's index along `axis_name` under the current transport."""
    return current().axis_index(axis_name)
