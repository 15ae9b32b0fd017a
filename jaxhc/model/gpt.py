"""The model on one device (GPT-2 or LLaMA): parameters, embedding, blocks, head, loss.

This is the reference the parallel model is tested against, and its pieces (`embed`, `run_blocks`,
`head`) are what each pipeline stage runs per shard.

The parameter tree of GPT-2 (the "single" layout; every mesh holds the same global arrays,
sharded)::

    wte      (vocab_size, C)   token embedding, tied with the LM head
    wpe      (block_size, C)   learned positions
    blocks   Block parameters stacked on a leading n_layer axis:
      ln_1, ln_2    {scale, bias}: (L, C)                       (L = n_layer, C = n_embd,
      attn/c_attn   kernel (L, C, 3, H, D), bias (L, 3, H, D)    H = n_head, D = head_dim)
      attn/c_proj   kernel (L, H, D, C),    bias (L, C)
      mlp/c_fc      kernel (L, C, 4C),      bias (L, 4C)
      mlp/c_proj    kernel (L, 4C, C),      bias (L, C)
    ln_f     {scale, bias}: (C,)

LLaMA's (`jaxhc.model.llama`; KV = n_kv_head, I = intermediate_size)::

    wte      (vocab_size, C)   token embedding (and the LM head when tied)
    lm_head  (vocab_size, C)   the LM head, when untied
    blocks   stacked on a leading n_layer axis:
      ln_1, ln_2        {scale}: (L, C)            RMSNorm
      attn/q_proj       kernel (L, C, H, D)
      attn/k_proj       kernel (L, C, KV, D)
      attn/v_proj       kernel (L, C, KV, D)
      attn/o_proj       kernel (L, H, D, C)
      mlp/gate_proj     kernel (L, C, I)
      mlp/up_proj       kernel (L, C, I)
      mlp/down_proj     kernel (L, I, C)
    ln_f     {scale}: (C,)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from jaxhc.model.config import GPTConfig
from jaxhc.model.layers import INIT_STD, Block, layer_norm
from jaxhc.model.llama import LlamaBlock, rms_norm
from jaxhc.model.tensor_parallel import TensorParallel


def block_module(cfg: GPTConfig):
    """The Flax module of one transformer block of `cfg`'s architecture."""
    return LlamaBlock if cfg.llama else Block


def init_params(cfg: GPTConfig, seed) -> dict:
    """GPT-2's initialization (normal 0.02, residual projections 0.02/sqrt(2 n_layer)) from
    `seed`, for either architecture (norms: scale 1, bias 0).

    Works under `jax.jit` with sharded outputs: the values depend on the seed only.
    """
    k_wte, k_wpe, k_blocks = jax.random.split(jax.random.key(seed), 3)
    c = cfg.n_embd
    dummy = jnp.zeros((1, 1, c), cfg.compute_dtype)
    blocks = jax.vmap(lambda k: block_module(cfg)(cfg).init(k, dummy)["params"])(
        jax.random.split(k_blocks, cfg.n_layer)
    )
    table = INIT_STD * jax.random.normal(k_wte, (cfg.vocab_size, c), jnp.float32)
    if cfg.llama:  # the second key: the untied head's
        params = {"wte": table, "blocks": blocks, "ln_f": {"scale": jnp.ones((c,), jnp.float32)}}
        if not cfg.tied:
            params["lm_head"] = INIT_STD * jax.random.normal(
                k_wpe, (cfg.vocab_size, c), jnp.float32
            )
        return params
    return {
        "wte": table,
        "wpe": INIT_STD * jax.random.normal(k_wpe, (cfg.block_size, c), jnp.float32),
        "blocks": blocks,
        "ln_f": {"scale": jnp.ones((c,), jnp.float32), "bias": jnp.zeros((c,), jnp.float32)},
    }


@functools.lru_cache(maxsize=32)
def param_shapes(cfg: GPTConfig) -> dict:
    """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s (`init_params` traced, not run;
    one trace per config: do not modify the tree returned)."""
    return jax.eval_shape(functools.partial(init_params, cfg), 0)


def embed(params: dict, idx: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Token (plus GPT-2's position) embedding of `idx` (..., T), in the compute dtype."""
    if cfg.llama:
        return params["wte"][idx].astype(cfg.compute_dtype)
    t = idx.shape[-1]
    return (params["wte"][idx] + params["wpe"][:t]).astype(cfg.compute_dtype)


def run_blocks(
    blocks: dict, x: jax.Array, cfg: GPTConfig, tp: TensorParallel | None = None, fetch=None
):
    """Apply the stacked `blocks` (leading layer axis) to `x` (B, T, C) in order.

    `tp`: this rank's tensor parallelism when `blocks` are a rank's slices (None: one device).
    A `lax.scan` over layers: one compiled block however deep the model.
    `fetch`: `blocks` are scan inputs from which ``fetch(layer, h, xs)`` runs a layer
    (``layer(params, h)``) on its parameters (sharded parameters gathered layer by layer); a
    fetch with a ``scan`` method runs the layers itself, ``fetch.scan(layer, x, blocks)`` (its
    scan carries more than the hidden state: `jaxhc.parallel.prefetch`).
    """
    block = block_module(cfg)(cfg, tp or TensorParallel())

    def apply(params, h):
        return block.apply({"params": params}, h)

    def layer(h, xs):
        return (apply(xs, h) if fetch is None else fetch(apply, h, xs)), None

    if hasattr(fetch, "scan"):
        return fetch.scan(apply, x, blocks)
    return jax.lax.scan(layer, x, blocks)[0]


def final_norm(params: dict, x: jax.Array, cfg: GPTConfig) -> jax.Array:
    """The final LayerNorm (GPT-2) or RMSNorm (LLaMA) of `x`."""
    if cfg.llama:
        return rms_norm(x, params["ln_f"]["scale"], cfg.layer_norm_eps)
    return layer_norm(x, params["ln_f"]["scale"], params["ln_f"]["bias"], cfg.layer_norm_eps)


def head(params: dict, x: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Final norm and the LM head (`wte` when tied, else ``lm_head``): float32 logits
    (..., vocab_size)."""
    dt = cfg.compute_dtype
    x = final_norm(params, x, cfg)
    table = params["wte"] if cfg.tied else params["lm_head"]
    return jnp.einsum(
        "...c,vc->...v", x.astype(dt), table.astype(dt), preferred_element_type=jnp.float32
    )


def token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Cross-entropy of each next-token prediction (float32, same shape as `targets`)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def logits(params: dict, idx: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Reference forward on one device: logits (B, T, vocab_size) of `idx` (B, T)."""
    return head(params, run_blocks(params["blocks"], embed(params, idx, cfg), cfg), cfg)


def loss(params: dict, tokens: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Reference loss: mean next-token cross-entropy of `tokens` (B, T + 1)."""
    return token_losses(logits(params, tokens[:, :-1], cfg), tokens[:, 1:]).mean()
