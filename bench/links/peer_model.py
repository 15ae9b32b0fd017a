"""jaxhc's GPT as transformers' torch `GPT2LMHeadModel`: its config and its starting weights.

The peer (PyTorch DDP, `bench/links/ddp.py`) trains transformers' own GPT-2 rather than a model
written here, configured to jaxhc's shape (gelu tanh, LayerNorm eps, tied head, no dropout), and
starts from jaxhc's initial parameters for the same seed, so both trainings begin at the same
point and their losses can be compared step by step.

transformers' torch GPT-2 stores its dense layers as `Conv1D` with weights (in, out) and computes
``x @ weight + bias``: jaxhc's kernels in (in, out) order, with the heads as their own axes, only
flatten into them (``c_attn`` (C, 3, H, D) -> (C, 3C), the output index ``which * C + head * D +
d`` in both). Numpy only: torch is needed by the caller alone.
"""

from __future__ import annotations

import numpy as np

from jaxhc.model.config import GPTConfig
from jaxhc.parallel.layout import DECAYED

__all__ = ["decayed_names", "gpt2_config", "gpt2_state"]

# torch parameter (within a layer) -> jaxhc path under blocks (None: the same leaf in every layer)
_LAYER = {
    "ln_1.weight": ("ln_1", "scale"),
    "ln_1.bias": ("ln_1", "bias"),
    "attn.c_attn.weight": ("attn", "c_attn", "kernel"),
    "attn.c_attn.bias": ("attn", "c_attn", "bias"),
    "attn.c_proj.weight": ("attn", "c_proj", "kernel"),
    "attn.c_proj.bias": ("attn", "c_proj", "bias"),
    "ln_2.weight": ("ln_2", "scale"),
    "ln_2.bias": ("ln_2", "bias"),
    "mlp.c_fc.weight": ("mlp", "c_fc", "kernel"),
    "mlp.c_fc.bias": ("mlp", "c_fc", "bias"),
    "mlp.c_proj.weight": ("mlp", "c_proj", "kernel"),
    "mlp.c_proj.bias": ("mlp", "c_proj", "bias"),
}
_SHARED = {
    "transformer.wte.weight": ("wte",),
    "transformer.wpe.weight": ("wpe",),
    "transformer.ln_f.weight": ("ln_f", "scale"),
    "transformer.ln_f.bias": ("ln_f", "bias"),
}


def gpt2_config(cfg: GPTConfig) -> dict:
    """Keyword arguments of a transformers `GPT2Config` with jaxhc's GPT shape and function.

    Raises ValueError (naming the key) for what transformers' GPT-2 cannot compute as jaxhc does.
    """
    if cfg.dtype != "float32":
        raise ValueError(f"model.dtype={cfg.dtype!r}: the PyTorch peer trains in float32 only")
    return {
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,  # 4 x n_embd, as jaxhc
        "activation_function": "gelu_new",  # GPT-2's gelu, tanh approximation
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
        "scale_attn_weights": True,
        "use_cache": False,
    }


def _paths(n_layer: int) -> dict[str, tuple[tuple[str, ...], int | None]]:
    """torch name -> (jaxhc path, layer index or None for the shared parameters)."""
    out = {name: (path, None) for name, path in _SHARED.items()}
    for i in range(n_layer):
        for name, path in _LAYER.items():
            out[f"transformer.h.{i}.{name}"] = (("blocks", *path), i)
    return out


def _as_torch(name: str, value: np.ndarray, c: int) -> np.ndarray:
    """One layer's jaxhc array in the shape of the torch parameter `name`."""
    if name.endswith("attn.c_attn.weight"):
        return value.reshape(c, 3 * c)  # (C, 3, H, D)
    if name.endswith("attn.c_proj.weight"):
        return value.reshape(c, c)  # (H, D, C)
    if name.endswith(".bias"):
        return value.reshape(-1)  # c_attn's (3, H, D)
    return value


def gpt2_state(params: dict, cfg: GPTConfig) -> dict[str, np.ndarray]:
    """jaxhc parameters (the single layout of `jaxhc.model.gpt`) -> a `GPT2LMHeadModel` state
    dict (float32 numpy arrays; the tied ``lm_head.weight`` is ``wte``)."""
    state = {}
    for name, (path, layer) in _paths(cfg.n_layer).items():
        node = params
        for key in path:
            node = node[key]
        value = np.asarray(node if layer is None else node[layer], np.float32)
        state[name] = np.array(_as_torch(name, value, cfg.n_embd), np.float32)  # writable, own
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def decayed_names(n_layer: int) -> set[str]:
    """The torch parameter names AdamW decays: those whose jaxhc leaf jaxhc decays (matrices and
    embeddings; no biases, no LayerNorm parameters)."""
    return {name for name, (path, _) in _paths(n_layer).items() if path[-1] in DECAYED}
