"""Per-device bytes and time of a step's data-parallel collectives under a sharding plan.

With sharded parameters (s_p > 1) the step all-gathers the device's 1/s_p chunk of its padded
flat vector over the parameter group's levels, outermost first ((k - 1) x chunk per level, the
chunk growing k-fold): with ``mesh.shard.gather: whole`` once per step (the forward; the backward
keeps the gathered copy); per layer (the default) the shared parameters' segment once and each
layer's segment before the layer runs, forward and again backward, for every micro-batch
(2 x microbatches x local layers messages of a layer's chunk; ``keep``: forward only). The
train step (`jaxhc.parallel.zero`) reduce-scatters the flat gradient vector (n bytes) level by
level, innermost first, once per step (not per micro-batch; per layer, over the parameter
group's levels, the shared segment and each layer's as their own messages): over a level of k ranks
(k - 1) / k x n, after which n shrinks k-fold; it all-gathers the reduced chunk back over the
levels outside the gradient group, outermost first ((k - 1) x n per level, n growing k-fold), and
then the updated optimizer-state chunk (c bytes) over the optimizer-state group's levels outside
the parameter group, outermost first ((k - 1) x c; s_p > 1: up to the device's parameter chunk).
These are the bytes a ring collective moves per device, which the ledger records as
``raw_bytes`` (tests/test_plan.py checks them per sub-axis and kind); under a policy,
`Collective.wire` gives the bytes jaxhc's compressed algorithms move (the ledger's
``wire_bytes``, also checked).

Which level moves what, how often, is `jaxhc.plan.steps.data_steps`'s rule, which
`jaxhc.plan.cost.collectives` prices too (with mixed precision, AMSP's schedules, tensor and
pipe traffic); in float32 it gives these bytes (tests/test_plan_cost.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxhc.collectives import resolve_codec, volume
from jaxhc.model.config import MeshConfig
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.plan.steps import data_steps


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a step on one device: where, what, how many bytes (raw, ring).

    >>> from jaxhc.model.config import MeshConfig
    >>> jaxhc.plan.data_collectives(MeshConfig(data=4), 4096)[0]  # doctest: +NORMALIZE_WHITESPACE
    Collective(axis='data', kind='grad', op='psum_scatter', ranks=4, group=4, bytes=3072.0,
               message=1024, count=1)
    """

    axis: str  # the data sub-axis
    kind: str  # "grad" or "param"
    op: str  # "psum_scatter" or "all_gather"
    ranks: int  # its participants
    group: int  # the data ranks of the group this level closes (its size times the inner ones)
    bytes: float  # per call
    message: int  # the float32 values this device passes in
    count: int = 1  # calls per step

    def wire(self, policy=None) -> float:
        """The bytes it moves under `policy` (a Policy, preset or YAML path; None: raw), as
        jaxhc's algorithms on the XLA transport move them: the codec's static payload per row or
        block (padded rows included) and the agreement flags of a codec that may fall back."""
        if policy is None:
            return self.bytes
        x = jax.ShapeDtypeStruct((self.message,), jnp.float32)
        codec = resolve_codec(x, self.axis, None, policy, self.kind)
        if codec is None:
            return self.bytes
        return volume.compressed(codec, self.op, self.ranks, self.message, jnp.float32)


def data_collectives(mesh: MeshConfig, flat_bytes: int, segments=None) -> list[Collective]:
    """The data-axis collectives of one train step on a device whose padded flat parameter
    vector has `flat_bytes` bytes, in the order the step runs them: with sharded parameters
    (s_p > 1) first the parameters' all-gathers over the parameter group (their reverse mode is
    the gradients' reduce-scatter over the same levels). Gathered per layer, `segments` gives
    the flat layout's (shared segment bytes, a layer's segment bytes, local layers).

    >>> from jaxhc.model.config import MeshConfig
    >>> [(c.op, c.bytes) for c in jaxhc.plan.data_collectives(MeshConfig(data=4), 4096)]
    [('psum_scatter', 3072.0), ('all_gather', 3072)]
    """
    shard = ShardPlan.of(mesh)
    factors = tuple(reversed(shard.sizes))  # innermost first
    sizes = (shard.params, shard.grads, shard.optim)
    segments = segments if shard.per_layer else None
    kept = shard.gather == "keep"
    m = mesh.microbatches
    steps = data_steps(factors, sizes, flat_bytes, segments, microbatches=m, kept=kept)
    return [
        Collective(
            shard.axes[-1 - s.level],
            s.kind,
            s.op,
            s.ranks,
            s.group,
            volume.raw(s.op, s.ranks, s.message),
            s.message // 4,
            s.count,
        )
        for s in steps
    ]
