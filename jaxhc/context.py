"""What jaxhc's collectives trace under: the compression policy, the transport, the accounting.

How context flows. `jaxhc train` reads a config whose ``compression`` names a policy;
`jaxhc.train.config.ExperimentConfig` loads it once into a `jaxhc.Policy`. The trainer passes that
object to the program builders (`jaxhc.parallel.make_train_step`, `per_shard_train_step`, ...),
which size the train state with it (error-feedback residuals) and trace their per-shard function
inside ``jaxhc.context.use(policy=policy)``; a `jaxhc.Launcher` likewise traces inside
``use(transport=...)`` (MPI or XLA), and each step runs inside a `jaxhc.accounting.Ledger`, which
switches on the collectives' traffic callbacks. Below that nothing passes any of it by hand: the
model, the pipeline and ZeRO call ``jaxhc.psum(x, "tensor", kind="act")`` and the like, and each
collective asks this module, while it is traced, for its codec (`policy`:
``policy.codec_for(axis, kind, dtype)``), its transport (`transport`) and whether to record
(`recording`); the codec's encode/decode are the FFI calls. An explicit ``codec=`` or ``policy=``
on a collective wins over the context.

All of it is one thread-local value, a `Context`, held by a `jax.make_user_context` state: jax
makes it part of every `jax.jit` cache key and trace context, so a function traced under one
policy (or transport, or accounting) is never reused under another; it is traced and compiled
again. `jaxhc.transport.use` and ``with ledger:`` are entry points onto this same value.

>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
>>> def f(g):
...     return jaxhc.psum(g, "data", kind="grad")         # the codec comes from the context
>>> step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
>>> g = jnp.linspace(0.0, 1.0, 2 * 65536).reshape(2, -1)
>>> with jaxhc.context.use(policy="zhybrid"):             # zfp:8 for data gradients
...     compressed = step(g)
>>> plain = step(g)                                       # no policy: lax.psum, compiled anew
>>> bool(jnp.array_equal(compressed, plain)), bool(jnp.allclose(compressed, plain, atol=1e-2))
(False, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax

from jaxhc.policy import Policy

if TYPE_CHECKING:  # the transport package imports this module (a cycle at run time only)
    from jaxhc.transport import Transport

__all__ = ["Context", "as_policy", "current", "policy", "recording", "transport", "use"]


@dataclasses.dataclass(frozen=True)
class Context:
    """The settings collectives trace under (hashable: it is part of jit's cache key).

    policy:    the `jaxhc.Policy` that chooses codecs, or None (plain `jax.lax` collectives).
    transport: the `jaxhc.transport.Transport` collectives move bytes with (None: XLA).
    ledger:    whether a `jaxhc.accounting.Ledger` is active.
    callbacks: False inside `jaxhc.accounting.disabled` (no traffic callbacks even in a Ledger).

    >>> jaxhc.context.current()
    Context(policy=None, transport=None, ledger=False, callbacks=True)
    """

    policy: Policy | None = None
    transport: Transport | None = None
    ledger: bool = False
    callbacks: bool = True


# The one thread-local value; its default is the global context.
_STATE = jax.make_user_context(Context())


def current() -> Context:
    """This thread's context.

    >>> with jaxhc.context.use(policy="q8"):
    ...     jaxhc.context.current().policy.name
    'q8'
    """
    return _STATE.value


def as_policy(policy: Policy | str | os.PathLike | None) -> Policy | None:
    """A Policy (unchanged), a preset name or a policy YAML path loaded, or None.

    >>> jaxhc.context.as_policy("zhybrid").name, jaxhc.context.as_policy(None)
    ('zhybrid', None)
    """
    return None if policy is None else Policy.load(policy)


def policy() -> Policy | None:
    """The policy collectives compress by when they are given neither ``codec=`` nor ``policy=``.

    >>> jaxhc.context.policy() is None
    True
    >>> with jaxhc.context.use(policy="mzhybrid"):
    ...     jaxhc.context.policy().codec_for("tensor")
    Mpc(dim=1, budget=0.95)
    """
    return current().policy


def transport() -> Transport:
    """The transport collectives trace with (XLA unless `use` says otherwise).

    >>> jaxhc.context.transport().name
    'xla'
    """
    chosen = current().transport
    if chosen is None:
        from jaxhc.transport.xla import XlaTransport

        return XlaTransport()
    return chosen


def recording() -> bool:
    """Whether collectives traced now record their traffic (a Ledger is active, not disabled).

    >>> with jaxhc.accounting.Ledger():
    ...     jaxhc.context.recording()
    True
    """
    ctx = current()
    return ctx.ledger and ctx.callbacks


_KEEP: Any = object()


@contextlib.contextmanager
def use(*, policy: Any = _KEEP, transport: Any = _KEEP):
    """Trace jaxhc collectives with `policy` and/or `transport` inside this block (what is not
    given stays as it was). ``policy=None``: plain collectives; a preset name or YAML path is
    loaded here. Yields the new `Context`.

    >>> with jaxhc.context.use(policy="zfp8") as ctx:
    ...     ctx.policy.codec_for("pipe")
    Zfp(rate=8.0, dims=1)
    """
    changes = {}
    if policy is not _KEEP:
        changes["policy"] = as_policy(policy)
    if transport is not _KEEP:
        changes["transport"] = transport
    with _replaced(**changes) as ctx:
        yield ctx


@contextlib.contextmanager
def _replaced(**changes):
    """This thread's context with `changes` inside the block (for `use` and the accounting)."""
    ctx = dataclasses.replace(current(), **changes)
    with _STATE(ctx):
        yield ctx
