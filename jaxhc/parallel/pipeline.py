"""GPipe over the "pipe" axis in SPMD form: all stages step in lockstep.

With S stages and M micro-batches the schedule has M + S - 1 ticks. At tick t, stage s works on
micro-batch ``m = t - s`` (a bubble when m is outside [0, M)):

    tick        0    1    2    3    4          (S = 3, M = 3)
    stage 0     m0   m1   m2   -    -
    stage 1     -    m0   m1   m2   -
    stage 2     -    -    m0   m1   m2

Each tick, every stage first receives the previous tick's output of the stage before it
(`jaxhc.ppermute`, ``kind="act"``), the first stage reads its next micro-batch instead, and all run
their layers. Bubble outputs are zeroed, so bubbles carry zeros (M of the M + S - 1 messages a stage
sends per step carry data). The backward schedule is `jax.grad` of this one: the scan runs in
reverse and each ppermute's compressed custom_vjp sends the cotangents to the previous stage.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxhc

AXIS = "pipe"


def gpipe(stage_fn: Callable[[jax.Array], jax.Array], x: jax.Array, policy) -> jax.Array:
    """Run `stage_fn` (this rank's layers) over the pipeline.

    x: (M, ...) micro-batch inputs, read on the first stage only.
    Returns (M, ...) outputs, meaningful on the last stage only.
    """
    stages = jaxhc.axis_size(AXIS)
    stage = jaxhc.axis_index(AXIS)
    micro = x.shape[0]
    downstream = [(s, s + 1) for s in range(stages - 1)]

    def tick(previous, t):
        if stages > 1:
            previous = jaxhc.ppermute(previous, AXIS, downstream, policy=policy, kind="act")
        inputs = jnp.where(stage == 0, x[jnp.minimum(t, micro - 1)], previous)
        m = t - stage
        out = jnp.where((m >= 0) & (m < micro), stage_fn(inputs), 0)
        return out, out

    _, outs = lax.scan(tick, jnp.zeros_like(x[0]), jnp.arange(micro + stages - 1))
    return outs[stages - 1 :]
