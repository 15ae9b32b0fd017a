"""Megatron's conjugate operators for tensor parallelism over the "tensor" mesh axis.

A tensor-parallel layer pair (column-parallel then row-parallel) is entered with `enter` and left
with `exit`:

* `enter`: identity forward, psum of the cotangent backward (each rank's branch contributes part of
  the input's gradient).
* `exit`: psum forward (each rank holds a partial sum of the output), identity backward.

Both reductions go through `jaxhc.psum` with ``kind="act"``, so they are compressed by the tensor
axis' entry of the policy in `jaxhc.context`. With these explicit operators every tensor rank
computes the same loss and the same gradients for tensor-replicated parameters (LayerNorms, biases
of row-parallel layers, embeddings), with no hidden reduction: the shard_map runs with
``check_vma=False`` and each rank differentiates its own copy of the loss.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxhc.collectives import psum

AXIS = "tensor"


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """How a block is split over the tensor axis: `size` ranks (their reductions are compressed
    by the policy of `jaxhc.context`).

    ``TensorParallel(size=1)`` (or None where a layer takes one) is the single-device model.
    """

    size: int = 1

    def enter(self, x: jax.Array) -> jax.Array:
        return x if self.size == 1 else _enter(x)

    def exit(self, x: jax.Array) -> jax.Array:
        return x if self.size == 1 else _exit(x)


def _psum(x):
    return psum(x, AXIS, kind="act")


@jax.custom_vjp
def _enter(x):
    return x


def _enter_fwd(x):
    return x, None


def _enter_bwd(_, ct):
    return (_psum(ct),)


_enter.defvjp(_enter_fwd, _enter_bwd)


@jax.custom_vjp
def _exit(x):
    return _psum(x)


def _exit_fwd(x):
    return _psum(x), None


def _exit_bwd(_, ct):
    return (ct,)


_exit.defvjp(_exit_fwd, _exit_bwd)
