"""The transport that jaxhc collectives trace with: the transport of `jaxhc.context`."""

from __future__ import annotations

import contextlib

import jax

from jaxhc import context
from jaxhc.transport._base import Transport


def current() -> Transport:
    """The transport collectives trace with (XLA unless `use` says otherwise).

    >>> jaxhc.transport.current().name
    'xla'
    """
    return context.transport()


@contextlib.contextmanager
def use(transport: Transport):
    """Trace jaxhc collectives with `transport` inside this block (yields it): the same as
    ``jaxhc.context.use(transport=transport)``.

    >>> from jaxhc.transport import XlaTransport
    >>> with jaxhc.transport.use(XlaTransport()) as chosen:
    ...     jaxhc.transport.current() is chosen
    True
    """
    with context.use(transport=transport):
        yield transport


def axis_size(axis_name) -> int:
    """Ranks along `axis_name` (a name or tuple of names) under the current transport.

    Per-shard code should use this and `axis_index` instead of `jax.lax`'s, so that it runs
    unchanged under shard_map (XLA transport) and one process per device (MPI transport).

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "tensor"))
    >>> def f(x):
    ...     return x + jaxhc.axis_size("data") * 10 + jaxhc.axis_size(("data", "tensor"))
    >>> jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P()))(jnp.zeros(()))
    Array(24., dtype=float32)
    """
    return current().axis_size(axis_name)


def axis_index(axis_name) -> jax.Array:
    """This rank's index along `axis_name` under the current transport.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    >>> f = jax.shard_map(lambda x: x + jaxhc.axis_index("data"), mesh=mesh,
    ...                   in_specs=P("data"), out_specs=P("data"))
    >>> jax.jit(f)(jnp.zeros(4))
    Array([0., 1., 2., 3.], dtype=float32)
    """
    return current().axis_index(axis_name)
