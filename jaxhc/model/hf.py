"""GPT-2 between transformers and jaxhc: configs and parameters both ways.

The common form is a GPT-2 state dict of numpy arrays as transformers' PyTorch `GPT2LMHeadModel`
names and lays it out (what ``model.safetensors`` files on the hub hold): ``h.{i}.attn.c_attn
.weight`` etc., with an optional ``transformer.`` prefix, and every dense ``weight`` as (in, out)
(GPT-2's Conv1D). transformers' Flax GPT-2 stores the same arrays as ``kernel`` (out, in),
``embedding`` and ``scale``; `flax_to_torch_names` maps its flattened tree onto the common form.
jaxhc stores (in, out) with the heads as their own axis (`jaxhc.model.gpt`). The LM head is
tied to ``wte``. Files (config.json, safetensors, msgpack, pytorch_model.bin): `jaxhc.model.hf_io`.
"""

from __future__ import annotations

import numpy as np

from jaxhc.model.config import GPTConfig

__all__ = [
    "flax_to_torch_names",
    "from_hf_gpt2",
    "from_state_dict",
    "gpt_config",
    "hf_config",
    "to_state_dict",
]

_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Buffers that older checkpoints store beside the weights (the causal mask): not parameters.
_BUFFERS = (".attn.bias", ".attn.masked_bias")


def gpt_config(hf: dict, where: str = "config.json") -> GPTConfig:
    """The GPTConfig of a transformers GPT-2 config (config.json as a dict, transformers'
    defaults for missing keys); one-line errors for what jaxhc's GPT does not implement."""
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"{where}: model_type {model_type!r} is not gpt2")
    c = {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        **hf,
    }
    if c["activation_function"] not in _TANH_GELUS:
        raise ValueError(
            f"{where}: activation_function={c['activation_function']!r}: jaxhc uses gelu tanh"
        )
    if c["n_inner"] not in (None, 4 * c["n_embd"]):
        raise ValueError(f"{where}: n_inner={c['n_inner']}: jaxhc's GPT uses 4 x n_embd units")
    if (
        not c["tie_word_embeddings"]
        or not c["scale_attn_weights"]
        or c["scale_attn_by_inverse_layer_idx"]
    ):
        raise ValueError(
            f"{where}: jaxhc's GPT needs tied embeddings and attention scaled by 1/sqrt(d)"
        )
    return GPTConfig(
        vocab_size=c["vocab_size"],
        block_size=c["n_positions"],
        n_layer=c["n_layer"],
        n_head=c["n_head"],
        n_embd=c["n_embd"],
        layer_norm_eps=float(c["layer_norm_epsilon"]),
    )


def hf_config(cfg: GPTConfig, eos_id: int | None = None) -> dict:
    """config.json of transformers' GPT2LMHeadModel for `cfg` (trained without dropout)."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "tie_word_embeddings": True,
        "scale_attn_weights": True,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _layer_keys(cfg: GPTConfig):
    """(torch name suffix, jaxhc path, torch shape, jaxhc per-layer shape) of a block."""
    C, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim
    return [
        ("ln_1.weight", ("ln_1", "scale"), (C,), (C,)),
        ("ln_1.bias", ("ln_1", "bias"), (C,), (C,)),
        ("attn.c_attn.weight", ("attn", "c_attn", "kernel"), (C, 3 * C), (C, 3, H, D)),
        ("attn.c_attn.bias", ("attn", "c_attn", "bias"), (3 * C,), (3, H, D)),
        ("attn.c_proj.weight", ("attn", "c_proj", "kernel"), (C, C), (H, D, C)),
        ("attn.c_proj.bias", ("attn", "c_proj", "bias"), (C,), (C,)),
        ("ln_2.weight", ("ln_2", "scale"), (C,), (C,)),
        ("ln_2.bias", ("ln_2", "bias"), (C,), (C,)),
        ("mlp.c_fc.weight", ("mlp", "c_fc", "kernel"), (C, 4 * C), (C, 4 * C)),
        ("mlp.c_fc.bias", ("mlp", "c_fc", "bias"), (4 * C,), (4 * C,)),
        ("mlp.c_proj.weight", ("mlp", "c_proj", "kernel"), (4 * C, C), (4 * C, C)),
        ("mlp.c_proj.bias", ("mlp", "c_proj", "bias"), (C,), (C,)),
    ]


def _top_keys(cfg: GPTConfig):
    V, T, C = cfg.vocab_size, cfg.block_size, cfg.n_embd
    return [
        ("wte.weight", ("wte",), (V, C)),
        ("wpe.weight", ("wpe",), (T, C)),
        ("ln_f.weight", ("ln_f", "scale"), (C,)),
        ("ln_f.bias", ("ln_f", "bias"), (C,)),
    ]


def from_state_dict(cfg: GPTConfig, state: dict, where: str = "checkpoint") -> dict:
    """jaxhc's single-layout parameters (float32 numpy) of a GPT-2 state dict in the common
    form (see the module); a missing, misshapen or unexpected array is one line naming it."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    head = state.pop("lm_head.weight", None)
    used = set()

    def take(name, shape):
        if name not in state:
            raise ValueError(f"{where}: no {name}")
        x = np.asarray(state[name], np.float32)
        if x.shape != shape:
            raise ValueError(f"{where}: {name} has shape {list(x.shape)}, expected {list(shape)}")
        used.add(name)
        return x

    params: dict = {}
    for name, path, shape in _top_keys(cfg):
        _put(params, path, take(name, shape))
    blocks: dict = {}
    for suffix, path, shape, ours in _layer_keys(cfg):
        layers = [take(f"h.{i}.{suffix}", shape).reshape(ours) for i in range(cfg.n_layer)]
        _put(blocks, path, np.stack(layers))
    params["blocks"] = blocks
    extra = sorted(set(state) - used)
    if extra:
        raise ValueError(
            f"{where}: unexpected array {extra[0]} (not GPT-2 with {cfg.n_layer} layers)"
        )
    if head is not None and not np.array_equal(np.asarray(head, np.float32), params["wte"]):
        raise ValueError(f"{where}: lm_head.weight differs from wte.weight (jaxhc ties them)")
    return params


def to_state_dict(cfg: GPTConfig, params: dict) -> dict[str, np.ndarray]:
    """The common form (``transformer.``-prefixed, as GPT2LMHeadModel saves it, the tied head
    left out) of jaxhc's single-layout parameters."""
    out = {}
    for name, path, shape in _top_keys(cfg):
        out[f"transformer.{name}"] = np.asarray(_get(params, path), np.float32).reshape(shape)
    for suffix, path, shape, _ in _layer_keys(cfg):
        stacked = np.asarray(_get(params["blocks"], path), np.float32)
        for i in range(cfg.n_layer):
            out[f"transformer.h.{i}.{suffix}"] = np.ascontiguousarray(stacked[i].reshape(shape))
    return out


def flax_to_torch_names(flat: dict) -> dict:
    """transformers' Flax GPT-2 parameters, flattened with "." (``transformer.h.0.attn.c_attn
    .kernel``), in the common form: ``kernel`` (out, in) -> ``weight`` (in, out), ``embedding``
    and ``scale`` -> ``weight``."""
    out = {}
    for key, value in flat.items():
        stem, _, leaf = key.rpartition(".")
        if leaf == "kernel":
            out[f"{stem}.weight"] = np.asarray(value).T
        elif leaf in ("embedding", "scale"):
            out[f"{stem}.weight"] = np.asarray(value)
        else:
            out[key] = np.asarray(value)
    return out


def from_hf_gpt2(model) -> tuple[GPTConfig, dict]:
    """(GPTConfig, parameters in jaxhc's single layout) of a transformers `FlaxGPT2LMHeadModel`.

    >>> from transformers import GPT2Config, FlaxGPT2LMHeadModel            # doctest: +SKIP
    >>> hf = FlaxGPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4)) # doctest: +SKIP
    >>> cfg, params = from_hf_gpt2(hf)                                      # doctest: +SKIP
    """
    cfg = gpt_config(model.config.to_dict(), "FlaxGPT2LMHeadModel")
    return cfg, from_state_dict(cfg, flax_to_torch_names(flatten(model.params)), "the model")


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested dict of arrays as {"a.b.c": array}."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _put(tree: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: dict, path: tuple):
    for key in path:
        tree = tree[key]
    return tree
