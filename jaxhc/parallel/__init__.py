"""Data x tensor x pipeline parallelism for jaxhc's GPT, every byte through jaxhc's collectives.

One module per concern: `pipeline` (the GPipe schedule), `layout` (where each parameter lives
on the mesh, the flat ZeRO vector), `amsp` (the sharding plan of ``mesh.shard``: the data axis
as nested groups), `zero` (the sharded AdamW update), `prefetch` (per-layer ZeRO-3 gathers
started a layer ahead), `state` (the train state and its placement), `fidelity` (the compressed
gradient reduction against an exact one, sampled) and `step` (the per-shard programs and their
jitted `shard_map`s). The model's
tensor-parallel layers use Megatron's operators from `jaxhc.model.tensor_parallel`.

The API a training loop calls::

    mesh = make_mesh(mesh_cfg)                                   # axes ("data", "tensor", "pipe")
    policy = jaxhc.Policy.load("zhybrid")                        # once
    state = init_state(model_cfg, mesh_cfg, optim_cfg, mesh, seed, policy=policy)
    step = make_train_step(model_cfg, mesh_cfg, optim_cfg, mesh, policy)
    state, metrics = step(state, tokens)                         # tokens int32 [B, block_size + 1]
    loss = make_eval_loss(model_cfg, mesh_cfg, mesh, policy)(state.params, tokens)

The builders are the only places a policy is passed: they size the state with it (error-feedback
residuals; with "tensor" > 1 its data-axis block codecs shape the flat ZeRO vectors) and trace
their per-shard programs inside ``jaxhc.context.use(policy=policy)``; the model, pipeline and ZeRO
code below call jaxhc's collectives with a traffic ``kind`` only.

`params_to_single` / `from_single` move parameters between the mesh and `jaxhc.model.gpt`;
`per_shard_train_step` / `per_shard_eval_loss` / `train_state_specs` / `initial_state` are the
same programs for a launcher that runs one process per device (`jaxhc.train.mpi`).
"""

from jaxhc.parallel.state import TrainState as TrainState
from jaxhc.parallel.state import from_single as from_single
from jaxhc.parallel.state import init_state as init_state
from jaxhc.parallel.state import initial_state as initial_state
from jaxhc.parallel.state import make_mesh as make_mesh
from jaxhc.parallel.state import params_to_single as params_to_single
from jaxhc.parallel.state import train_state_specs as train_state_specs
from jaxhc.parallel.step import METRIC_SPECS as METRIC_SPECS
from jaxhc.parallel.step import make_eval_loss as make_eval_loss
from jaxhc.parallel.step import make_logits as make_logits
from jaxhc.parallel.step import make_loss_and_grads as make_loss_and_grads
from jaxhc.parallel.step import make_train_step as make_train_step
from jaxhc.parallel.step import per_shard_eval_loss as per_shard_eval_loss
from jaxhc.parallel.step import per_shard_train_step as per_shard_train_step

__all__ = [
    "METRIC_SPECS",
    "TrainState",
    "from_single",
    "init_state",
    "initial_state",
    "make_eval_loss",
    "make_logits",
    "make_loss_and_grads",
    "make_mesh",
    "make_train_step",
    "params_to_single",
    "per_shard_eval_loss",
    "per_shard_train_step",
    "train_state_specs",
]
