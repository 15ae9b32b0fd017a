"""jaxhc's models (GPT-2 and LLaMA architectures): configs, the single-device reference, HF import.

`logits` (and `jaxhc.model.gpt`: `init_params`, `loss`, ...) is the single-device reference model
of either architecture (``GPTConfig.arch``); `from_hf` imports a transformers GPT-2 or LLaMA model
(Flax or PyTorch). The data x tensor x pipeline parallel training step over a mesh is
`jaxhc.parallel`.
"""

from jaxhc.model import gpt as gpt
from jaxhc.model.config import GPTConfig as GPTConfig
from jaxhc.model.config import MeshConfig as MeshConfig
from jaxhc.model.config import OptimConfig as OptimConfig
from jaxhc.model.config import ShardConfig as ShardConfig
from jaxhc.model.config import validate as validate
from jaxhc.model.gpt import logits as logits
from jaxhc.model.hf import from_hf as from_hf
from jaxhc.model.hf import from_hf_gpt2 as from_hf_gpt2

__all__ = [
    "GPTConfig",
    "MeshConfig",
    "OptimConfig",
    "ShardConfig",
    "from_hf",
    "from_hf_gpt2",
    "gpt",
    "logits",
    "validate",
]
