"""The GPT-2 model on one device: parameters, embedding, blocks, tied head, loss.

This is the reference the parallel model is tested against, and its pieces (`embed`, `run_blocks`,
`head`) are what each pipeline stage runs per shard.

The parameter tree (the "single" layout; every mesh holds the same global arrays, sharded)::

    wte      (vocab_size, C)   token embedding, tied with the LM head
    wpe      (block_size, C)   learned positions
    blocks   Block parameters stacked on a leading n_layer axis:
      ln_1, ln_2    {scale, bias}: (L, C)                       (L = n_layer, C = n_embd,
      attn/c_attn   kernel (L, C, 3, H, D), bias (L, 3, H, D)    H = n_head, D = head_dim)
      attn/c_proj   kernel (L, H, D, C),    bias (L, C)
      mlp/c_fc      kernel (L, C, 4C),      bias (L, 4C)
      mlp/c_proj    kernel (L, 4C, C),      bias (L, C)
    ln_f     {scale, bias}: (C,)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxhc.model.config import GPTConfig
from jaxhc.model.layers import INIT_STD, Block, layer_norm
from jaxhc.model.tensor_parallel import TensorParallel


def init_params(cfg: GPTConfig, seed) -> dict:
    """GPT-2 initialization (normal 0.02, residual projections 0.02/sqrt(2 n_layer)) from `seed`.

    Works under `jax.jit` with sharded outputs: the values depend on the seed only.
    """
    k_wte, k_wpe, k_blocks = jax.random.split(jax.random.key(seed), 3)
    c = cfg.n_embd
    dummy = jnp.zeros((1, 1, c), cfg.compute_dtype)
    blocks = jax.vmap(lambda k: Block(cfg).init(k, dummy)["params"])(
        jax.random.split(k_blocks, cfg.n_layer)
    )
    return {
        "wte": INIT_STD * jax.random.normal(k_wte, (cfg.vocab_size, c), jnp.float32),
        "wpe": INIT_STD * jax.random.normal(k_wpe, (cfg.block_size, c), jnp.float32),
        "blocks": blocks,
        "ln_f": {"scale": jnp.ones((c,), jnp.float32), "bias": jnp.zeros((c,), jnp.float32)},
    }


def embed(params: dict, idx: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Token plus position embedding of `idx` (..., T), in the compute dtype."""
    t = idx.shape[-1]
    return (params["wte"][idx] + params["wpe"][:t]).astype(cfg.compute_dtype)


def run_blocks(
    blocks: dict, x: jax.Array, cfg: GPTConfig, tp: TensorParallel | None = None, fetch=None
):
    """Apply the stacked `blocks` (leading layer axis) to `x` (B, T, C) in order.

    `tp`: this rank's tensor parallelism when `blocks` are a rank's slices (None: one device).
    A `lax.scan` over layers: one compiled block however deep the model.
    `fetch`: `blocks` are scan inputs from which ``fetch(layer, h, xs)`` runs a layer
    (``layer(params, h)``) on its parameters (sharded parameters gathered layer by layer).
    """
    block = Block(cfg, tp or TensorParallel())

    def apply(params, h):
        return block.apply({"params": params}, h)

    def layer(h, xs):
        return (apply(xs, h) if fetch is None else fetch(apply, h, xs)), None

    return jax.lax.scan(layer, x, blocks)[0]


def head(params: dict, x: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Final LayerNorm and the LM head tied to `wte`: float32 logits (..., vocab_size)."""
    dt = cfg.compute_dtype
    x = layer_norm(x, params["ln_f"]["scale"], params["ln_f"]["bias"], cfg.layer_norm_eps)
    return jnp.einsum(
        "...c,vc->...v", x.astype(dt), params["wte"].astype(dt), preferred_element_type=jnp.float32
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
