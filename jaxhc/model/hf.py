"""Import a transformers `FlaxGPT2LMHeadModel` (transformers 4.57.x) into jaxhc's GPT.

transformers' Flax GPT-2 stores every dense kernel as (out_features, in_features) and computes
``x @ kernel.T`` (e.g. ``c_attn`` is (3C, C), output index ``which * C + head * head_dim + d``);
jaxhc stores (in, out) with the heads as their own axis. Its LM head is tied to ``wte``.
"""

from __future__ import annotations

import numpy as np

from jaxhc.model.config import GPTConfig

_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def from_hf_gpt2(model) -> tuple[GPTConfig, dict]:
    """(GPTConfig, parameters in jaxhc's single layout) of a transformers `FlaxGPT2LMHeadModel`.

    >>> from transformers import GPT2Config, FlaxGPT2LMHeadModel            # doctest: +SKIP
    >>> hf = FlaxGPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4)) # doctest: +SKIP
    >>> cfg, params = from_hf_gpt2(hf)                                      # doctest: +SKIP
    """
    c = model.config
    if c.activation_function not in _TANH_GELUS:
        raise ValueError(f"activation_function={c.activation_function!r}: jaxhc uses gelu tanh")
    if c.n_inner not in (None, 4 * c.n_embd):
        raise ValueError(f"n_inner={c.n_inner}: jaxhc's GPT uses 4 x n_embd hidden units")
    if not c.tie_word_embeddings or not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx:
        raise ValueError("jaxhc's GPT needs tied embeddings and attention scaled by 1/sqrt(d)")
    cfg = GPTConfig(
        vocab_size=c.vocab_size,
        block_size=c.n_positions,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_embd=c.n_embd,
        layer_norm_eps=c.layer_norm_epsilon,
    )
    p = model.params["transformer"]
    C, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim

    def stack(*keys, transform=lambda w: w):
        """One parameter of every layer, converted by `transform`, stacked on a layer axis."""
        out = []
        for i in range(cfg.n_layer):
            w = p["h"][str(i)]
            for k in keys:
                w = w[k]
            out.append(transform(np.asarray(w, np.float32)))
        return np.stack(out)

    def ln(name):
        return {"scale": stack(name, "scale"), "bias": stack(name, "bias")}

    def dense(*keys, kernel_shape=None, bias_shape=None):
        """(out, in) kernel -> (in, out) reshaped to `kernel_shape`; bias reshaped likewise."""
        kernel = stack(*keys, "kernel", transform=lambda w: w.T.reshape(kernel_shape or w.T.shape))
        bias = stack(*keys, "bias", transform=lambda b: b.reshape(bias_shape or b.shape))
        return {"kernel": kernel, "bias": bias}

    blocks = {
        "ln_1": ln("ln_1"),
        "attn": {
            "c_attn": dense("attn", "c_attn", kernel_shape=(C, 3, H, D), bias_shape=(3, H, D)),
            "c_proj": dense("attn", "c_proj", kernel_shape=(H, D, C)),
        },
        "ln_2": ln("ln_2"),
        "mlp": {"c_fc": dense("mlp", "c_fc"), "c_proj": dense("mlp", "c_proj")},
    }
    params = {
        "wte": np.asarray(p["wte"]["embedding"], np.float32),
        "wpe": np.asarray(p["wpe"]["embedding"], np.float32),
        "blocks": blocks,
        "ln_f": {k: np.asarray(p["ln_f"][k], np.float32) for k in ("scale", "bias")},
    }
    return cfg, params
