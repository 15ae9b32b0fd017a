"""Sampling from jaxhc's GPT on one device with a key/value cache.

The cache holds every layer's keys and values for the model's whole context (``block_size``
positions, fixed size, so one compiled step serves every token): a prompt is run once (the
prefill, padded to the context), then each new token costs one position's forward pass against
the cache. GPT-2's positions are learned and absolute, so when the context is full the last
`keep` tokens (three quarters of the context) are run again as a new prompt and decoding goes on
from there: every token is predicted from at least `keep` tokens before it (or all there are).

The math is `jaxhc.model.gpt`'s (the same norms, MLP and head; attention over the cached
positions instead of a causal square), so the logits agree with `gpt.logits` of the same tokens.
LLaMA caches its ``n_kv_head`` key/value heads, rotated at their positions; it restarts from the
last `keep` tokens like GPT-2 (its rotary positions would allow a sliding cache; this keeps one
program for both).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxhc.model import gpt
from jaxhc.model.config import GPTConfig
from jaxhc.model.layers import MLP, layer_norm
from jaxhc.model.llama import SwiGLU, attend, rms_norm, rotary

__all__ = ["forward", "generate", "init_cache", "keep_tokens", "sample"]


def init_cache(cfg: GPTConfig, batch: int) -> dict:
    """Zero keys and values for every layer and position: (n_layer, B, block_size, H, D)
    (LLaMA: ``n_kv_head`` heads)."""
    shape = (cfg.n_layer, batch, cfg.block_size, cfg.kv_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, cfg.compute_dtype), "v": jnp.zeros(shape, cfg.compute_dtype)}


def forward(params: dict, idx: jax.Array, start, cache: dict, cfg: GPTConfig):
    """(logits (B, S, vocab), cache) of tokens `idx` (B, S) at positions ``start .. start+S-1``:
    their keys and values are written into `cache`, and each attends to the cached positions up
    to its own (``start + S`` must not exceed ``block_size``)."""
    dt = cfg.compute_dtype
    s = idx.shape[1]
    pos = start + jnp.arange(s)
    visible = jnp.arange(cfg.block_size)[None, :] <= pos[:, None]  # (S, block_size)
    if cfg.llama:
        x = params["wte"][idx].astype(dt)
        layer = _llama_layer(cfg, start, pos, visible)
        h, (ks, vs) = lax.scan(layer, x, (params["blocks"], cache["k"], cache["v"]))
        return gpt.head(params, h, cfg), {"k": ks, "v": vs}
    x = (params["wte"][idx] + params["wpe"][pos]).astype(dt)
    mlp = MLP(cfg)

    def layer(h, xs):
        p, k_cache, v_cache = xs
        attn = p["attn"]
        a = layer_norm(h, p["ln_1"]["scale"], p["ln_1"]["bias"], cfg.layer_norm_eps)
        qkv = jnp.tensordot(a, attn["c_attn"]["kernel"].astype(dt), axes=1)
        qkv = qkv + attn["c_attn"]["bias"].astype(dt)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, S, H, D)
        k_cache = lax.dynamic_update_slice(k_cache, k.astype(dt), (0, start, 0, 0))
        v_cache = lax.dynamic_update_slice(v_cache, v.astype(dt), (0, start, 0, 0))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k_cache, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(cfg.head_dim)
        scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
        att = jax.nn.softmax(scores, axis=-1).astype(dt)
        y = jnp.einsum("bhqk,bkhd->bqhd", att, v_cache)
        y = jnp.tensordot(y, attn["c_proj"]["kernel"].astype(dt), axes=2)
        h = h + y + attn["c_proj"]["bias"].astype(dt)
        m = layer_norm(h, p["ln_2"]["scale"], p["ln_2"]["bias"], cfg.layer_norm_eps)
        h = h + mlp.apply({"params": p["mlp"]}, m)
        return h, (k_cache, v_cache)

    h, (ks, vs) = lax.scan(layer, x, (params["blocks"], cache["k"], cache["v"]))
    return gpt.head(params, h, cfg), {"k": ks, "v": vs}


def _llama_layer(cfg: GPTConfig, start, pos, visible):
    """One LLaMA layer of `forward` as a scan body: (h, (params, k cache, v cache))."""
    dt, eps = cfg.compute_dtype, cfg.layer_norm_eps
    mlp = SwiGLU(cfg)

    def layer(h, xs):
        p, k_cache, v_cache = xs
        attn = p["attn"]
        a = rms_norm(h, p["ln_1"]["scale"], eps)

        def proj(name):
            return jnp.tensordot(a, attn[name]["kernel"].astype(dt), axes=1)

        q = rotary(proj("q_proj"), pos, cfg.theta)
        k = rotary(proj("k_proj"), pos, cfg.theta)
        k_cache = lax.dynamic_update_slice(k_cache, k.astype(dt), (0, start, 0, 0))
        v_cache = lax.dynamic_update_slice(v_cache, proj("v_proj").astype(dt), (0, start, 0, 0))
        y = attend(q, k_cache, v_cache, visible)
        h = h + jnp.tensordot(y, attn["o_proj"]["kernel"].astype(dt), axes=2)
        h = h + mlp.apply({"params": p["mlp"]}, rms_norm(h, p["ln_2"]["scale"], eps))
        return h, (k_cache, v_cache)

    return layer


def sample(logits: jax.Array, key, temperature, top_k, vocab: int) -> jax.Array:
    """Next tokens (B,) from logits (B, V): the most likely where ``temperature == 0``, else a
    draw from softmax(logits / temperature) over the `top_k` most likely (0: all). Ids from
    `vocab` on (padding of the embedding past the tokenizer's vocabulary) are never chosen."""
    n = logits.shape[-1]
    logits = jnp.where(jnp.arange(n) < vocab, logits, -jnp.inf)
    greedy = jnp.argmax(logits, axis=-1)
    scaled = logits / jnp.maximum(temperature, 1e-6)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take(jnp.sort(scaled, axis=-1), n - k, axis=-1)
    scaled = jnp.where(scaled >= kth[..., None], scaled, -jnp.inf)
    drawn = jax.random.categorical(key, scaled, axis=-1)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


def keep_tokens(cfg: GPTConfig) -> int:
    """How many tokens are kept as the new prompt when the context is full."""
    return max(1, cfg.block_size - cfg.block_size // 4)


@functools.cache
def _programs(cfg: GPTConfig, vocab: int):
    """The jitted prefill and decode step; everything they take is an array (numpy on the
    host side), so no eager op compiles anything of its own."""

    def key(seed, index):
        return jax.random.fold_in(jax.random.key(seed), index)

    def prefill(params, idx, n, seed, index, temperature, top_k):
        logits, cache = forward(params, idx, 0, init_cache(cfg, idx.shape[0]), cfg)
        last = lax.dynamic_index_in_dim(logits, n - 1, axis=1, keepdims=False)
        return sample(last, key(seed, index), temperature, top_k, vocab), cache

    def step(params, token, pos, cache, seed, index, temperature, top_k):
        logits, cache = forward(params, token[:, None], pos, cache, cfg)
        return sample(logits[:, 0], key(seed, index), temperature, top_k, vocab), cache

    return jax.jit(prefill), jax.jit(step, donate_argnums=3)


def generate(
    params: dict,
    cfg: GPTConfig,
    prompt: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    vocab: int | None = None,
    eos_id: int | None = None,
) -> list[int]:
    """Up to `max_new_tokens` tokens following `prompt` (token ids, at least one), stopping
    after `eos_id`; the same `seed` gives the same tokens. See `sample` for the choice."""
    if not prompt:
        raise ValueError("the prompt has no tokens")
    if max_new_tokens < 1:
        return []
    params = jax.device_put(params)  # once: not a host-to-device copy per token
    vocab = cfg.vocab_size if vocab is None else vocab
    prefill, step = _programs(cfg, vocab)
    t, keep = cfg.block_size, keep_tokens(cfg)
    i32 = np.int32
    choice = (np.float32(temperature), i32(top_k))

    def start(context):
        idx = np.zeros((1, t), i32)
        idx[0, : len(context)] = context
        return prefill(params, idx, i32(len(context)), i32(seed), i32(len(out)), *choice)

    out: list[int] = []
    context = list(prompt)[-t:]
    token, cache = start(context)
    while True:
        out.append(int(np.asarray(token)[0]))
        if len(out) == max_new_tokens or out[-1] == eos_id:
            return out
        if len(context) == t:  # the context is full: start again from its last `keep` tokens
            context = [*context[len(context) - keep + 1 :], out[-1]]
            token, cache = start(context)
        else:
            pos = len(context)
            context.append(out[-1])
            token, cache = step(params, token, i32(pos), cache, i32(seed), i32(len(out)), *choice)
