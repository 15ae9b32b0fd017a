"""jaxhc's GPT (GPT-2 architecture): configs, the single-device reference model, HF import.

`jaxhc.model.gpt` is the single-device reference model (`init_params`, `logits`, `loss`);
`from_hf_gpt2` imports a transformers Flax GPT-2. The data x tensor x pipeline parallel training
step over a mesh is `jaxhc.parallel`.
"""

from jaxhc.model import gpt as gpt
from jaxhc.model.config import GPTConfig as GPTConfig
from jaxhc.model.config import MeshConfig as MeshConfig
from jaxhc.model.config import OptimConfig as OptimConfig
from jaxhc.model.config import ShardConfig as ShardConfig
from jaxhc.model.config import validate as validate
from jaxhc.model.hf import from_hf_gpt2 as from_hf_gpt2

__all__ = [
    "GPTConfig",
    "MeshConfig",
    "OptimConfig",
    "ShardConfig",
    "from_hf_gpt2",
    "gpt",
    "validate",
]
