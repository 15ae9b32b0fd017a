"""jaxhc's GPT (GPT-2 architecture) and its data x tensor x pipeline parallel training step.

The API a training loop calls::

    mesh = make_mesh(mesh_cfg)                                   # axes ("data", "tensor", "pipe")
    state = init_state(model_cfg, mesh_cfg, optim_cfg, mesh, seed)
    step = make_train_step(model_cfg, mesh_cfg, optim_cfg, mesh, policy)
    state, metrics = step(state, tokens)                         # tokens int32 [B, block_size + 1]
    loss = make_eval_loss(model_cfg, mesh_cfg, mesh, policy)(state.params, tokens)

`jaxhc.model.gpt` is the single-device reference model; `params_to_single` / `from_single` move
parameters between it and the mesh; `from_hf_gpt2` imports a transformers Flax GPT-2.
"""

from jaxhc.model import gpt as gpt
from jaxhc.model.config import GPTConfig as GPTConfig
from jaxhc.model.config import MeshConfig as MeshConfig
from jaxhc.model.config import OptimConfig as OptimConfig
from jaxhc.model.config import validate as validate
from jaxhc.model.hf import from_hf_gpt2 as from_hf_gpt2
from jaxhc.parallel.step import TrainState as TrainState
from jaxhc.parallel.step import from_single as from_single
from jaxhc.parallel.step import init_state as init_state
from jaxhc.parallel.step import make_eval_loss as make_eval_loss
from jaxhc.parallel.step import make_logits as make_logits
from jaxhc.parallel.step import make_loss_and_grads as make_loss_and_grads
from jaxhc.parallel.step import make_mesh as make_mesh
from jaxhc.parallel.step import make_train_step as make_train_step
from jaxhc.parallel.step import params_to_single as params_to_single

__all__ = [
    "GPTConfig",
    "MeshConfig",
    "OptimConfig",
    "TrainState",
    "from_hf_gpt2",
    "from_single",
    "gpt",
    "init_state",
    "make_eval_loss",
    "make_logits",
    "make_loss_and_grads",
    "make_mesh",
    "make_train_step",
    "params_to_single",
    "validate",
]
