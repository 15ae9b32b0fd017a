"""GPT-2 and LLaMA between transformers and jaxhc: configs and parameters both ways.

The common form is a state dict of numpy arrays as transformers' PyTorch models name and lay it
out (what ``model.safetensors`` files on the hub hold). GPT-2 (`GPT2LMHeadModel`): ``h.{i}.attn
.c_attn.weight`` etc., with an optional ``transformer.`` prefix, every dense ``weight`` as (in,
out) (GPT-2's Conv1D), the LM head tied to ``wte``. LLaMA (`LlamaForCausalLM`): ``model.layers.{i}
.self_attn.q_proj.weight`` etc., dense weights as (out, in) (``nn.Linear``), ``lm_head.weight``
unless tied. transformers' Flax models store the same arrays as ``kernel`` (transposed),
``embedding`` and ``scale``; `flax_to_torch_names` maps their flattened trees onto the common
form. jaxhc stores (in, out) with the heads as their own axis (`jaxhc.model.gpt`). Files
(config.json, safetensors, msgpack, pytorch_model.bin): `jaxhc.model.hf_io`.
"""

from __future__ import annotations

import numpy as np

from jaxhc.model.config import GPTConfig

__all__ = [
    "config_of",
    "flax_to_torch_names",
    "from_hf",
    "from_hf_gpt2",
    "from_state_dict",
    "gpt_config",
    "hf_config",
    "llama_config",
    "to_state_dict",
]

_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Buffers that older checkpoints store beside the weights (the causal mask): not parameters.
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def config_of(hf: dict, where: str = "config.json") -> GPTConfig:
    """The GPTConfig of a transformers GPT-2 or LLaMA config (by its ``model_type``)."""
    model_type = hf.get("model_type", "gpt2")
    if model_type == "llama":
        return llama_config(hf, where)
    if model_type != "gpt2":
        raise ValueError(f"{where}: model_type {model_type!r} is not gpt2 or llama")
    return gpt_config(hf, where)


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


def llama_config(hf: dict, where: str = "config.json") -> GPTConfig:
    """The GPTConfig (``arch: llama``) of a transformers LLaMA config (transformers' defaults
    for missing keys); one-line errors for what jaxhc's LLaMA does not implement."""
    c = {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": None,
        **hf,
    }
    rope = c.get("rope_parameters") or {}
    theta = rope.get("rope_theta", c["rope_theta"])
    scaling = c["rope_scaling"] or (rope if rope.get("rope_type", "default") != "default" else None)
    if c["hidden_act"] != "silu":
        raise ValueError(f"{where}: hidden_act={c['hidden_act']!r}: jaxhc's LLaMA uses silu")
    if scaling:
        raise ValueError(f"{where}: rope_scaling={scaling!r}: jaxhc's LLaMA has plain rotary")
    if c["attention_bias"] or c["mlp_bias"]:
        raise ValueError(f"{where}: attention_bias/mlp_bias: jaxhc's LLaMA has no biases")
    heads = c["num_attention_heads"]
    if c["head_dim"] not in (None, c["hidden_size"] // heads):
        raise ValueError(
            f"{where}: head_dim={c['head_dim']}: jaxhc's LLaMA uses hidden_size / heads"
        )
    kv = c["num_key_value_heads"]
    return GPTConfig(
        arch="llama",
        vocab_size=c["vocab_size"],
        block_size=c["max_position_embeddings"],
        n_layer=c["num_hidden_layers"],
        n_head=heads,
        n_embd=c["hidden_size"],
        layer_norm_eps=float(c["rms_norm_eps"]),
        n_kv_head=heads if kv is None else kv,
        intermediate_size=c["intermediate_size"],
        rope_theta=float(theta),
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
    )


def hf_config(cfg: GPTConfig, eos_id: int | None = None) -> dict:
    """config.json of transformers' GPT2LMHeadModel or LlamaForCausalLM for `cfg` (trained
    without dropout)."""
    if cfg.llama:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.n_embd,
            "intermediate_size": cfg.ffn,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": cfg.block_size,
            "rms_norm_eps": cfg.layer_norm_eps,
            "rope_theta": cfg.theta,
            "rope_scaling": None,
            "tie_word_embeddings": cfg.tied,
            "attention_bias": False,
            "mlp_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": eos_id,
            "eos_token_id": eos_id,
            "torch_dtype": "float32",
        }
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
    """(torch name suffix, jaxhc path, torch shape, jaxhc per-layer shape, transposed) of a
    block; `transposed`: the torch weight is (out, in) (``nn.Linear``), jaxhc's (in, out)."""
    C, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim
    if cfg.llama:
        K, F = cfg.kv_heads, cfg.ffn
        return [
            ("input_layernorm.weight", ("ln_1", "scale"), (C,), (C,), False),
            ("self_attn.q_proj.weight", ("attn", "q_proj", "kernel"), (H * D, C), (C, H, D), True),
            ("self_attn.k_proj.weight", ("attn", "k_proj", "kernel"), (K * D, C), (C, K, D), True),
            ("self_attn.v_proj.weight", ("attn", "v_proj", "kernel"), (K * D, C), (C, K, D), True),
            ("self_attn.o_proj.weight", ("attn", "o_proj", "kernel"), (C, H * D), (H, D, C), True),
            ("post_attention_layernorm.weight", ("ln_2", "scale"), (C,), (C,), False),
            ("mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), (F, C), (C, F), True),
            ("mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), (F, C), (C, F), True),
            ("mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), (C, F), (F, C), True),
        ]
    return [
        ("ln_1.weight", ("ln_1", "scale"), (C,), (C,), False),
        ("ln_1.bias", ("ln_1", "bias"), (C,), (C,), False),
        ("attn.c_attn.weight", ("attn", "c_attn", "kernel"), (C, 3 * C), (C, 3, H, D), False),
        ("attn.c_attn.bias", ("attn", "c_attn", "bias"), (3 * C,), (3, H, D), False),
        ("attn.c_proj.weight", ("attn", "c_proj", "kernel"), (C, C), (H, D, C), False),
        ("attn.c_proj.bias", ("attn", "c_proj", "bias"), (C,), (C,), False),
        ("ln_2.weight", ("ln_2", "scale"), (C,), (C,), False),
        ("ln_2.bias", ("ln_2", "bias"), (C,), (C,), False),
        ("mlp.c_fc.weight", ("mlp", "c_fc", "kernel"), (C, 4 * C), (C, 4 * C), False),
        ("mlp.c_fc.bias", ("mlp", "c_fc", "bias"), (4 * C,), (4 * C,), False),
        ("mlp.c_proj.weight", ("mlp", "c_proj", "kernel"), (4 * C, C), (4 * C, C), False),
        ("mlp.c_proj.bias", ("mlp", "c_proj", "bias"), (C,), (C,), False),
    ]


def _top_keys(cfg: GPTConfig):
    V, T, C = cfg.vocab_size, cfg.block_size, cfg.n_embd
    if cfg.llama:
        return [
            ("embed_tokens.weight", ("wte",), (V, C)),
            ("norm.weight", ("ln_f", "scale"), (C,)),
        ]
    return [
        ("wte.weight", ("wte",), (V, C)),
        ("wpe.weight", ("wpe",), (T, C)),
        ("ln_f.weight", ("ln_f", "scale"), (C,)),
        ("ln_f.bias", ("ln_f", "bias"), (C,)),
    ]


def _prefixes(cfg: GPTConfig) -> tuple[str, str]:
    """The prefix of the transformer's names and of a layer's (``{i}``: its number)."""
    return ("model.", "layers.{i}.") if cfg.llama else ("transformer.", "h.{i}.")


def from_state_dict(cfg: GPTConfig, state: dict, where: str = "checkpoint") -> dict:
    """jaxhc's single-layout parameters (float32 numpy) of a GPT-2 or LLaMA state dict (as
    `cfg` says) in the common form (see the module); a missing, misshapen or unexpected array is
    one line naming it."""
    prefix, layer = _prefixes(cfg)
    state = {k.removeprefix(prefix): v for k, v in state.items()}
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
    for suffix, path, shape, ours, transposed in _layer_keys(cfg):
        layers = []
        for i in range(cfg.n_layer):
            x = take(layer.format(i=i) + suffix, shape)
            layers.append((x.T if transposed else x).reshape(ours))
        _put(blocks, path, np.stack(layers))
    params["blocks"] = blocks
    extra = sorted(set(state) - used)
    if extra:
        arch = "LLaMA" if cfg.llama else "GPT-2"
        raise ValueError(
            f"{where}: unexpected array {extra[0]} (not {arch} with {cfg.n_layer} layers)"
        )
    if not cfg.tied:
        if head is None:
            raise ValueError(f"{where}: no lm_head.weight (the model's head is untied)")
        state["lm_head.weight"] = head
        params["lm_head"] = take("lm_head.weight", (cfg.vocab_size, cfg.n_embd))
    elif head is not None and not np.array_equal(np.asarray(head, np.float32), params["wte"]):
        table = "embed_tokens.weight" if cfg.llama else "wte.weight"
        raise ValueError(f"{where}: lm_head.weight differs from {table} (the head is tied)")
    return params


def to_state_dict(cfg: GPTConfig, params: dict) -> dict[str, np.ndarray]:
    """The common form (prefixed as GPT2LMHeadModel and LlamaForCausalLM save it, a tied head
    left out) of jaxhc's single-layout parameters."""
    prefix, layer = _prefixes(cfg)
    out = {}
    for name, path, shape in _top_keys(cfg):
        out[prefix + name] = np.ascontiguousarray(_get(params, path), np.float32).reshape(shape)
    for suffix, path, shape, _, transposed in _layer_keys(cfg):
        stacked = np.asarray(_get(params["blocks"], path), np.float32)
        for i in range(cfg.n_layer):
            x = stacked[i].reshape(shape[::-1]).T if transposed else stacked[i].reshape(shape)
            out[prefix + layer.format(i=i) + suffix] = np.ascontiguousarray(x)
    if not cfg.tied:
        out["lm_head.weight"] = np.ascontiguousarray(params["lm_head"], np.float32)
    return out


def flax_to_torch_names(flat: dict) -> dict:
    """transformers' Flax GPT-2 or LLaMA parameters, flattened with "." (``transformer.h.0.attn
    .c_attn.kernel``), in the common form: ``kernel`` -> ``weight`` transposed (GPT-2: (out, in)
    -> (in, out); LLaMA: the other way), ``embedding`` and ``scale`` -> ``weight``."""
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
    """(GPTConfig, parameters in jaxhc's single layout) of a transformers `FlaxGPT2LMHeadModel`
    (`from_hf` takes LLaMA and PyTorch models too)."""
    cfg = gpt_config(model.config.to_dict(), "FlaxGPT2LMHeadModel")
    return cfg, from_state_dict(cfg, flax_to_torch_names(flatten(model.params)), "the model")


def from_hf(model) -> tuple[GPTConfig, dict]:
    """(GPTConfig, parameters in jaxhc's single layout) of a transformers GPT-2 or LLaMA model:
    a Flax one (`FlaxGPT2LMHeadModel`, `FlaxLlamaForCausalLM`) or a PyTorch one
    (`GPT2LMHeadModel`, `LlamaForCausalLM`: its ``state_dict``).

    >>> from transformers import LlamaConfig, FlaxLlamaForCausalLM          # doctest: +SKIP
    >>> hf = FlaxLlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2, intermediate_size=128))  # doctest: +SKIP
    >>> cfg, params = from_hf(hf)                                           # doctest: +SKIP
    >>> logits = jaxhc.model.logits(params, tokens, cfg)                    # doctest: +SKIP
    """
    name = type(model).__name__
    cfg = config_of(model.config.to_dict(), name)
    if hasattr(model, "params"):  # Flax
        state = flax_to_torch_names(flatten(model.params))
    elif hasattr(model, "state_dict"):  # PyTorch
        state = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    else:
        raise ValueError(f"{name}: not a transformers Flax or PyTorch model")
    return cfg, from_state_dict(cfg, state, name)


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
