"""GPipe over the "pipe" axis in SPMD form: all stages step in lockstep.

With S stages and M micro-batches the schedule has M + S - 1 ticks. At tick t, stage s works on
micro-batch ``m = t - s`` (a bubble when m is outside [0, M)):

    tick        0    1    2    3    4          (S = 3, M = 3)
    stage 0     m0   m1   m2   .    .
    stage 1     .    m0   m1   m2   .
    stage 2     .    .    m0   m1   m2

At the start of each tick, the stages that finished a micro-batch at the previous tick send it to
the next stage (`jaxhc.ppermute`, ``kind="act"``; the pairs are known per tick, so bubbles send
nothing and each stage boundary carries exactly M messages per step). The first stage reads its
next micro-batch instead. A stage runs its layers only on the M ticks that hold a micro-batch: on
a tick where some stage is in a bubble, the layers sit in a `lax.cond` on the stage index, so a
bubble computes nothing and sends none of the layers' tensor-parallel sums. The predicate is the
same on every rank of a "tensor" group (they share the pipe stage), which is what a collective
inside a branch needs. The backward schedule is `jax.grad` of this one: the cotangents go back
through the conjugate (inverse) ppermutes and the layers' backward runs in the same conds.

Per step, each stage runs its layers (and their "tensor" sums) M times, not M + S - 1: at
M = S = 2 the bubbles were a third of the tensor traffic.

The ticks are a Python loop, not `lax.scan`: each tick has its own static set of sending pairs
and of working stages, which is what keeps bubbles free of messages.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxhc

AXIS = "pipe"


def gpipe(stage_fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """Run `stage_fn` (this rank's layers) over the pipeline.

    x: (M, ...) micro-batch inputs, read on the first stage only.
    Returns (M, ...) outputs, meaningful on the last stage only.
    """
    stages = jaxhc.axis_size(AXIS)
    stage = jaxhc.axis_index(AXIS)
    micro = x.shape[0]
    out, outs = None, []
    for t in range(micro + stages - 1):
        received = 0.0
        if stages > 1 and t > 0:
            # Stage s sends what it computed at tick t - 1 if that was micro-batch 0..M-1.
            senders = range(max(0, t - micro), min(t - 1, stages - 2) + 1)
            received = jaxhc.ppermute(out, AXIS, tuple((s, s + 1) for s in senders), kind="act")
        h = jnp.where(stage == 0, x[min(t, micro - 1)], received)
        first, last = _working(t, micro, stages)
        if first == 0 and last == stages - 1:  # no bubble at this tick
            out = stage_fn(h)
        else:  # a bubble passes its input through: its output is neither sent nor used
            out = lax.cond((stage >= first) & (stage <= last), stage_fn, lambda h: h, h)
        outs.append(out)
    return jnp.stack(outs[stages - 1 :])


def _working(tick: int, micro: int, stages: int) -> tuple[int, int]:
    """The first and last stage holding a micro-batch at `tick` (stage s works on ``tick - s``)."""
    return max(0, tick - micro + 1), min(tick, stages - 1)
