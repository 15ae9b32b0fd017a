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

>>> import jaxhc
>>> with jaxhc.context.use(policy="zhybrid"):            # doctest: +SKIP
...     y = jaxhc.psum(grads, "data", kind="grad")       # zfp:8, as the policy says for data
...     z = jaxhc.psum(grads, "data", codec="q8")        # explicit: q8
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax

from jaxhc.policy import Policy

if TYPE_CHECKING:  # the transport package imports this module; its base does not
    from jaxhc.transport._base import Transport

__all__ = ["Context", "as_policy", "current", "policy", "recording", "transport", "use"]


@dataclasses.dataclass(frozen=True)
class Context:
    """The settings collectives trace under (hashable: it is part of jit's cache key).

    policy:    the `jaxhc.Policy` that chooses codecs, or None (plain `jax.lax` collectives).
    transport: the `jaxhc.transport.Transport` collectives move bytes with (None: XLA).
    ledger:    whether a `jaxhc.accounting.Ledger` is active.
    callbacks: False inside `jaxhc.accounting.disabled` (no traffic callbacks even in a Ledger).
    """

    policy: Policy | None = None
    transport: Transport | None = None
    ledger: bool = False
    callbacks: bool = True


# The one thread-local value; its default is the global context.
_STATE = jax.make_user_context(Context())


def current() -> Context:
    """This thread's context."""
    return _STATE.value


def as_policy(policy: Policy | str | os.PathLike | None) -> Policy | None:
    """A Policy (unchanged), a preset name or a policy YAML path loaded, or None."""
    return None if policy is None else Policy.load(policy)


def policy() -> Policy | None:
    """The policy collectives compress by when they are given neither ``codec=`` nor ``policy=``."""
    return current().policy


def transport() -> Transport:
    """The transport collectives trace with (XLA unless `use` says otherwise)."""
    chosen = current().transport
    if chosen is None:
        from jaxhc.transport.xla import XlaTransport

        return XlaTransport()
    return chosen


def recording() -> bool:
    """Whether collectives traced now record their traffic (a Ledger is active, not disabled)."""
    ctx = current()
    return ctx.ledger and ctx.callbacks


_KEEP: Any = object()


@contextlib.contextmanager
def use(*, policy: Any = _KEEP, transport: Any = _KEEP):
    """Trace jaxhc collectives with `policy` and/or `transport` inside this block (what is not
    given stays as it was). ``policy=None``: plain collectives; a preset name or YAML path is
    loaded here. Yields the new `Context`."""
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
