"""jaxhc's GPT (GPT-2 architecture) and its data x tensor x pipeline parallel training step.

The API a training loop calls::

    mesh = make_mesh(mesh_cfg)                                   # axes ("data", "tensor", "pipe")
    state = init_state(model_cfg, mesh_cfg, optim_cfg, mesh, seed)
    step = make_train_step(model_cfg, mesh_cfg, optim_cfg, mesh, policy)
    state, metrics = step(state, tokens)                         # tokens int32 [B, block_size + 1]
    loss = make_eval_loss(model_cfg, mesh_cfg, mesh, policy)(state.params, tokens)

Where per-shard programs are run by a launcher rather than `jax.shard_map` (one process per
device under MPI), `per_shard_train_step` / `per_shard_eval_loss` are the programs and
`initial_state` / `train_state_specs` the global host state and its PartitionSpecs.

`jaxhc.model.gpt` is the single-device reference model; `params_to_single` / `from_single` move
parameters between it and the mesh; `from_hf_gpt2` imports a transformers Flax GPT-2.
"""

from jaxhc.model import gpt as gpt
from jaxhc.model.config import GPTConfig as GPTConfig
from jaxhc.model.config import MeshConfig as MeshConfig
from jaxhc.model.config import OptimConfig as OptimConfig
from jaxhc.model.config import validate as validate
from jaxhc.model.hf import from_hf_gpt2 as from_hf_gpt2
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
    "GPTConfig",
    "MeshConfig",
    "OptimConfig",
    "TrainState",
    "from_hf_gpt2",
    "from_single",
    "gpt",
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
    "validate",
]
