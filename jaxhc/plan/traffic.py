"""Per-device bytes and time of a step's data-parallel collectives under a sharding plan.

With sharded parameters (s_p > 1) the step all-gathers the device's 1/s_p chunk of its padded
flat vector over the parameter group's levels, outermost first ((k - 1) x chunk per level, the
chunk growing k-fold): with ``mesh.shard.gather: whole`` once per step (the forward; the backward
keeps the gathered copy); per layer (the default) the shared parameters' segment once and each
layer's segment before the layer runs, forward and again backward, for every micro-batch
(2 x microbatches x local layers messages of a layer's chunk). The
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

`jaxhc.plan.cost.collectives` generalises these (mixed precision, tensor and pipe traffic) and
times them; in float32 it gives these bytes (tests/test_plan_cost.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxhc.collectives import resolve_codec, volume
from jaxhc.model.config import MeshConfig
from jaxhc.parallel.amsp import ShardPlan


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
    inner = dict.fromkeys(shard.axes, 1)
    n = 1
    for axis, size in reversed(list(zip(shard.axes, shard.sizes, strict=True))):
        n *= size
        inner[axis] = n
    size_of = dict(zip(shard.axes, shard.sizes, strict=True))
    levels = list(zip(shard.axes, shard.sizes, strict=True))
    param_axes = shard.param_axes  # () when s_p = 1
    out = []

    def add(axis, kind, op, k, bytes_, n, count=1):
        out.append(Collective(axis, kind, op, k, inner[axis], bytes_, n // 4, count))

    # the messages over the parameter group, (bytes, calls per step): gathered, and their
    # reverse mode's reduce-scatters
    if shard.per_layer:
        shared, layer, layers = segments
        gathers = [(shared, 1), (layer, 2 * mesh.microbatches * layers)]
        scatters = [(shared, 1), (layer, layers)]
    else:
        gathers = scatters = [(flat_bytes, 1)]
    for whole, count in gathers:
        p = whole // shard.params
        for axis in param_axes:
            if (k := size_of[axis]) > 1:
                add(axis, "param", "all_gather", k, volume.raw("all_gather", k, p), p, count)
                p *= k
    for whole, count in scatters:
        n = whole
        for axis, k in reversed(levels):
            if axis in param_axes:
                if k > 1:
                    add(axis, "grad", "psum_scatter", k, volume.raw("psum_scatter", k, n), n, count)
                n //= k
    n = flat_bytes // shard.params  # the levels outside the parameter group, the whole vector
    for axis, k in reversed(levels):
        if axis not in param_axes:
            if k > 1:
                add(axis, "grad", "psum_scatter", k, volume.raw("psum_scatter", k, n), n)
            n //= k
    for axis, k in levels:
        if k > 1 and axis not in shard.grad_axes:
            add(axis, "grad", "all_gather", k, volume.raw("all_gather", k, n), n)
            n *= k
    m = flat_bytes // shard.optim
    for axis in shard.optim_axes:  # up to the parameter chunk: not over the parameter group
        if (k := size_of[axis]) > 1 and axis not in param_axes:
            add(axis, "param", "all_gather", k, volume.raw("all_gather", k, m), m)
            m *= k
    return out
