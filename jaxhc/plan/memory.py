"""Per-device bytes of a sharding plan's state: parameters (P), gradients (G), optimizer (OS).

jaxhc keeps everything in float32: a device holds its parameters (its tensor/pipe block: the
parameter tree when s_p = 1, its 1/s_p chunk of the padded flat vector when s_p > 1), AdamW's two
moments and the exact master copy of 1/s_os of its padded flat vector, and after the reduction
1/s_g of the summed gradients; AdamW's step count and the train step are int32 scalars. With error
feedback it also holds a residual per reduce-scatter level, the vector that level sends: the
padded vector at the innermost level, 1/(the inner levels' ranks) of it further out.
`flat_bytes` is that count from the flat vector's sizes and the plan's shard sizes and levels, the
one rule both `state_bytes` (a runtime `Plan`) and the planner's memory model
(`jaxhc.plan.cost.memory`, a `jaxhc.plan.Layout`) count by. `state_bytes` counts what the compiled
train step takes as its (donated) state, to the byte (tests/test_plan.py checks it against XLA's
memory analysis); the gradient chunk is a temporary.

`amsp_bytes` counts as AMSP does for mixed-precision training (Chen et al. 2023, Table 1):
parameters and gradients in 16 bits, optimizer state in 32 (master copy, two moments):
2 psi / s_p + 2 psi / s_g + 12 psi / s_os for psi parameters.
"""

from __future__ import annotations

import dataclasses

from jaxhc.model.config import GPTConfig, MeshConfig
from jaxhc.parallel import zero
from jaxhc.parallel.state import Plan

FLOAT32 = 4
OPT_VECTORS = 3  # AdamW's mu and nu, the master copy
SCALARS = 2  # the step and AdamW's count, int32


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes one device holds: P, G (the reduced gradient chunk), OS (with the scalars and any
    error-feedback residual).

    >>> jaxhc.plan.StateBytes(params=4000, grads=500, optim=1500)
    StateBytes(params=4000, grads=500, optim=1500)
    """

    params: int
    grads: int
    optim: int

    @property
    def state(self) -> int:
        """What the train step carries from one step to the next: P + OS."""
        return self.params + self.optim

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim


def state_bytes(model: GPTConfig, mesh: MeshConfig, policy=None) -> StateBytes:
    """The per-device bytes of `model` trained on `mesh` (with its ``mesh.shard`` plan).

    >>> from jaxhc.model.config import GPTConfig, MeshConfig
    >>> model = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
    >>> jaxhc.plan.state_bytes(model, MeshConfig(data=2))
    StateBytes(params=3337216, grads=1672192, optim=5016584)
    """
    plan = Plan(model, mesh, policy=policy)
    levels = [k for _, k in zero.levels(plan.shard)] if plan.error_feedback else ()
    return flat_bytes(plan.layout.size, plan.layout.padded, plan.shard, levels)


def flat_bytes(size: int, padded: int, shard, levels=()) -> StateBytes:
    """The per-device state of jaxhc's float32 flat layout: `size` the device's parameters and
    `padded` its padded flat vector (`jaxhc.parallel.layout.FlatLayout`'s ``size``, ``padded``),
    `shard` its sizes (``params``, ``grads``, ``optim``: a `ShardPlan` or a planner `Layout`),
    `levels` with error feedback the data levels' sizes, innermost first (a residual for each of
    more than one rank, `jaxhc.parallel.zero.level_residuals`), else empty.

    >>> from jaxhc.parallel.amsp import ShardPlan
    >>> shard = ShardPlan(data=8, params=1, grads=8, optim=8, axes=("data",), sizes=(8,))
    >>> jaxhc.plan.flat_bytes(1000, 1024, shard, levels=(8,))
    StateBytes(params=4000, grads=512, optim=5640)
    """
    residuals = sum(zero.level_residuals(padded, levels))
    optim = OPT_VECTORS * padded // shard.optim + SCALARS + residuals
    params = padded // shard.params if shard.params > 1 else size
    return StateBytes(
        params=FLOAT32 * params,
        grads=FLOAT32 * padded // shard.grads,
        optim=FLOAT32 * optim,
    )


def amsp_bytes(psi: int, shard) -> StateBytes:
    """AMSP's mixed-precision count for `psi` parameters under `shard` (its ``params``,
    ``grads``, ``optim``: a `ShardPlan` or a planner `Layout`).

    >>> from jaxhc.model.config import MeshConfig
    >>> from jaxhc.parallel.amsp import ShardPlan
    >>> shard = ShardPlan.of(MeshConfig(data=8, shard={"optim": 4, "grads": 1}))
    >>> jaxhc.plan.amsp_bytes(1000, shard)
    StateBytes(params=2000, grads=2000, optim=3000)
    """
    return StateBytes(
        params=2 * psi // shard.params, grads=2 * psi // shard.grads, optim=12 * psi // shard.optim
    )
