"""Per-device bytes of a sharding plan's state: parameters (P), gradients (G), optimizer (OS).

jaxhc keeps everything in float32: a device holds its parameters (its tensor/pipe block: the
parameter tree when s_p = 1, its 1/s_p chunk of the padded flat vector when s_p > 1), AdamW's two
moments and the exact master copy of 1/s_os of its padded flat vector, and after the reduction
1/s_g of the summed gradients; AdamW's step count and the train step are int32 scalars. With error
feedback it also holds a residual per reduce-scatter level, the vector that level sends: the
padded vector at the innermost level, 1/(the inner levels' ranks) of it further out.
`state_bytes` counts what the compiled train step takes as its (donated) state, to the byte
(tests/test_plan.py checks it against XLA's memory analysis); the gradient chunk is a temporary.

`amsp_bytes` counts as AMSP does for mixed-precision training (Chen et al. 2023, Table 1):
parameters and gradients in 16 bits, optimizer state in 32 (master copy, two moments):
2 psi / s_p + 2 psi / s_g + 12 psi / s_os for psi parameters.
"""

from __future__ import annotations

import dataclasses

from jaxhc.model.config import GPTConfig, MeshConfig
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.state import Plan
from jaxhc.parallel.zero import residual_sizes

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
    shard, layout = plan.shard, plan.layout
    optim = OPT_VECTORS * layout.padded // shard.optim + SCALARS
    if plan.error_feedback:
        optim += sum(residual_sizes(layout.padded, shard))
    params = layout.padded // shard.params if shard.sharded_params else layout.size
    return StateBytes(
        params=FLOAT32 * params,
        grads=FLOAT32 * layout.padded // shard.grads,
        optim=FLOAT32 * optim,
    )


def amsp_bytes(psi: int, shard: ShardPlan) -> StateBytes:
    """AMSP's mixed-precision count for `psi` parameters under `shard`.

    >>> from jaxhc.model.config import MeshConfig
    >>> from jaxhc.parallel.amsp import ShardPlan
    >>> shard = ShardPlan.of(MeshConfig(data=8, shard={"optim": 4, "grads": 1}))
    >>> jaxhc.plan.amsp_bytes(1000, shard)
    StateBytes(params=2000, grads=2000, optim=3000)
    """
    return StateBytes(
        params=2 * psi // shard.params, grads=2 * psi // shard.grads, optim=12 * psi // shard.optim
    )
