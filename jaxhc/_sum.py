"""The rank-order sum: every reduction jaxhc computes itself adds its P pieces with this one.

Pieces are added in rank order 0..P-1 (``((p0 + p1) + p2) + ...``), unrolled (XLA:CPU compiled
``x.sum(0)`` over a (P, n) stack ~5x slower), in an accumulator type, and rounded to the pieces'
type once at the end. Two accumulation rules, measured on XLA:CPU (jax 0.10.2):

* ``wide16=False``, XLA's own all-reduce and reduce-scatter: bfloat16 adds in float32, every
  other type (float16 included) in itself. The MPI transport's raw collectives and the XLA
  transport's cross-process reduce-scatter use it, so their results are bitwise those of
  XLA:CPU's in-process collectives.
* ``wide16=True``, jaxhc's compressed reductions (`jaxhc.codecs.Codec.decode_sum`, the native
  ``decode_sum`` kernels and the fused MPI collectives): both 16-bit float types add in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def accumulator(dtype, *, wide16: bool):
    """The type the pieces of `dtype` are added in under the rule `wide16` (see the module)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bfloat16 or (wide16 and dtype == jnp.float16):
        return jnp.dtype(jnp.float32)
    return dtype


def sum_in_rank_order(pieces: jax.Array, *, wide16: bool) -> jax.Array:
    """``pieces[0] + pieces[1] + ... + pieces[P-1]`` in that order, accumulated as `accumulator`
    says and rounded once to ``pieces.dtype``; pieces is (P, ...), P >= 1."""
    acc_dtype = accumulator(pieces.dtype, wide16=wide16)
    acc = pieces[0].astype(acc_dtype)
    for j in range(1, pieces.shape[0]):
        acc = acc + pieces[j].astype(acc_dtype)
    return acc.astype(pieces.dtype)
