"""How faithful the compressed gradient reduction is: its error against the exact reduction.

On a sampled step the train step reduces the same local gradients a second time with plain
`jax.lax` collectives (the shared embeddings' gradients between the end stages, then the ZeRO
reduce-scatter over "data") and compares this rank's chunk of the compressed sum `g` (what AdamW
receives: with error feedback, the carried residual included) with the exact one `e`, over the
whole model (each parameter counted once, as in the gradient norm):

    grad_rel_err = ||g - e|| / ||e||        grad_cos = <g, e> / (||g|| ||e||)

The second reduction is measurement, not training traffic: it is traced with accounting disabled,
so the ledger (and the metrics' byte counts) do not see it. It costs a reduction's time, so it is
off by default (``train.fidelity_every``: every k steps; 0 = never).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxhc
from jaxhc import accounting
from jaxhc.parallel import zero
from jaxhc.parallel.layout import FlatLayout, per_value

METRICS = ("grad_rel_err", "grad_cos")


def not_sampled() -> dict:
    """The metrics of a step without a sample: NaN."""
    return {k: jnp.float32(jnp.nan) for k in METRICS}


def compare(g: jax.Array, exact: jax.Array, layout: FlatLayout, start=None, shard=None) -> dict:
    """grad_rel_err and grad_cos of every rank's finest chunk `g` (which starts at `start`;
    default: the ZeRO chunk of its data rank) against `exact` (per shard); `shard`: the plan of
    `jaxhc.parallel.amsp` whose data axes the sums run over (default: "data")."""
    start = zero.chunk_start(layout) if start is None else start
    owned = layout.owned_rows(
        jaxhc.axis_index("tensor"), jaxhc.axis_index("pipe"), start, layout.chunk
    )
    mine = per_value(owned)
    g, exact = (jnp.where(mine, v, 0.0).astype(jnp.float32) for v in (g, exact))
    sums = jnp.stack(
        [
            jnp.sum(jnp.square(g - exact)),
            jnp.sum(jnp.square(exact)),
            jnp.vdot(g, exact),
            jnp.sum(jnp.square(g)),
        ]
    )
    diff, ee, ge, gg = zero.psum_scalar(sums, zero.all_axes(shard))
    return {"grad_rel_err": jnp.sqrt(diff / ee), "grad_cos": ge / jnp.sqrt(gg * ee)}


def sample(
    step: jax.Array,
    every: int,
    g: jax.Array,
    start,
    local_grads,
    exact_chunk: Callable,
    layout: FlatLayout,
    shard=None,
) -> dict:
    """On steps divisible by `every` (> 0), `compare(g, exact_chunk(local_grads), ...)` on the
    finest chunks (starting at `start`); NaN otherwise. The predicate is the replicated step,
    the same on every rank, as the collectives inside the branch need."""
    if every <= 0:
        return not_sampled()

    def measure():
        with accounting.disabled():
            return compare(g, exact_chunk(local_grads), layout, start, shard)

    return lax.cond(step % every == 0, measure, not_sampled)
