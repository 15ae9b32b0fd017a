"""The LLaMA transformer block as Flax modules, written per shard like `jaxhc.model.layers`.

Pre-RMSNorm blocks: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``. Attention has rotary
positions (the "rotate half" form of transformers' LLaMA: each head's first and second half of
dimensions are the pairs rotated) and ``n_kv_head`` key/value heads, each shared by
``n_head / n_kv_head`` consecutive query heads (grouped-query attention; one: multi-query). The
MLP is SwiGLU: ``down(silu(gate(x)) * up(x))``. No projection has a bias.

Tensor parallelism (``TensorParallel(size=T)``): each rank holds ``n_head / T`` query heads and
the ``n_kv_head / T`` key/value heads they read (a contiguous split keeps every group on one
rank), and ``intermediate_size / T`` of the MLP's units; q, k, v, gate and up are
column-parallel (entered once per sub-block), ``o_proj`` and ``down_proj`` row-parallel.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxhc.model.config import GPTConfig
from jaxhc.model.layers import ColumnParallel, RowParallel, proj_std
from jaxhc.model.tensor_parallel import TensorParallel

__all__ = ["Attention", "LlamaBlock", "RMSNorm", "SwiGLU", "attend", "rms_norm", "rotary"]


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32, then cast to `x`'s dtype and scaled (as
    transformers' LLaMA does)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
    return (scale * x32.astype(x.dtype)).astype(x.dtype)


class RMSNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x):
        return rms_norm(x, self.param("scale", nn.initializers.ones, (x.shape[-1],)), self.eps)


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of `x` (B, T, heads, D) at `positions` (T,), in float32."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq  # (T, D / 2)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, None, :]  # (T, 1, D)
    x32 = x.astype(jnp.float32)
    half = jnp.concatenate([-x32[..., d // 2 :], x32[..., : d // 2]], axis=-1)
    return (x32 * jnp.cos(angles) + half * jnp.sin(angles)).astype(x.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """Softmax attention (float32 scores) of q (B, T, H, D) over k, v (B, S, KV, D), query head
    h reading key/value head ``h // (H / KV)``; `visible` (T, S) masks what each query sees."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(visible, scores / math.sqrt(d), jnp.finfo(jnp.float32).min)
    att = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", att, v).reshape(b, t, h, d)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary positions over this rank's heads."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        cfg, tp, dt = self.cfg, self.tp, self.cfg.compute_dtype
        heads, kv = cfg.n_head // tp.size, cfg.kv_heads // tp.size
        x = tp.enter(x)

        def proj(n, name):
            return ColumnParallel((n, cfg.head_dim), tp, dt, bias=False, entered=True, name=name)(x)

        t = x.shape[1]
        positions = jnp.arange(t)
        q = rotary(proj(heads, "q_proj"), positions, cfg.theta)
        k = rotary(proj(kv, "k_proj"), positions, cfg.theta)
        y = attend(q, k, proj(kv, "v_proj"), jnp.tril(jnp.ones((t, t), bool)))
        return RowParallel(cfg.n_embd, 2, proj_std(cfg), tp, dt, bias=False, name="o_proj")(y)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` over this rank's ``intermediate_size / tp.size`` units."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        cfg, tp, dt = self.cfg, self.tp, self.cfg.compute_dtype
        units = (cfg.ffn // tp.size,)
        x = tp.enter(x)
        gate = ColumnParallel(units, tp, dt, bias=False, entered=True, name="gate_proj")(x)
        up = ColumnParallel(units, tp, dt, bias=False, entered=True, name="up_proj")(x)
        h = jax.nn.silu(gate) * up
        return RowParallel(cfg.n_embd, 1, proj_std(cfg), tp, dt, bias=False, name="down_proj")(h)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        eps = self.cfg.layer_norm_eps
        x = x + Attention(self.cfg, self.tp, name="attn")(RMSNorm(eps, name="ln_1")(x))
        return x + SwiGLU(self.cfg, self.tp, name="mlp")(RMSNorm(eps, name="ln_2")(x))
