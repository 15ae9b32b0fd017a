"""The GPT-2 transformer block as Flax modules, written per shard for Megatron tensor parallelism.

With ``TensorParallel(size=1)`` these are the plain single-device layers. With ``size=T`` each
module holds its rank's slice of the weights: attention heads split over the tensor axis, the MLP's
hidden units split, both entered through a column-parallel projection and left through a
row-parallel one whose partial sums are reduced by `TensorParallel.exit` before the (replicated)
bias is added.

Parameters are float32; they are cast to the compute dtype (``GPTConfig.dtype``) where used, and
LayerNorm statistics and softmax run in float32.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxhc.model.config import GPTConfig
from jaxhc.model.tensor_parallel import TensorParallel

INIT_STD = 0.02


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis, computed in float32, returned in `x`'s dtype."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    return ((x32 - mean) * lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


class LayerNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
        return layer_norm(x, scale, bias, self.eps)


class ColumnParallel(nn.Module):
    """``enter(x) @ kernel + bias``; `features` is this rank's slice of the output features.
    ``bias=False``: no bias (LLaMA); ``entered``: `x` has passed `TensorParallel.enter` already
    (projections that share one input enter it once)."""

    features: tuple[int, ...]
    tp: TensorParallel
    dtype: jnp.dtype
    bias: bool = True
    entered: bool = False

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.normal(INIT_STD)
        kernel = self.param("kernel", init, (x.shape[-1], *self.features))
        x = x if self.entered else self.tp.enter(x)
        y = jnp.tensordot(x, kernel.astype(self.dtype), axes=1)
        if not self.bias:
            return y
        return y + self.param("bias", nn.initializers.zeros, self.features).astype(self.dtype)


class RowParallel(nn.Module):
    """``exit(x @ kernel) + bias``: contracts the last `in_dims` dims (this rank's slice) of `x`.
    ``bias=False``: no bias (LLaMA)."""

    features: int
    in_dims: int
    std: float
    tp: TensorParallel
    dtype: jnp.dtype
    bias: bool = True

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.normal(self.std)
        kernel = self.param("kernel", init, (*x.shape[-self.in_dims :], self.features))
        y = self.tp.exit(jnp.tensordot(x, kernel.astype(self.dtype), axes=self.in_dims))
        if not self.bias:
            return y
        return y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(self.dtype)


def proj_std(cfg: GPTConfig) -> float:
    # GPT-2: residual projections scaled by 1/sqrt(2 n_layer) (two per block).
    return INIT_STD / math.sqrt(2 * cfg.n_layer)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over this rank's ``n_head / tp.size`` heads."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        cfg, dt = self.cfg, self.cfg.compute_dtype
        heads = cfg.n_head // self.tp.size
        qkv = ColumnParallel((3, heads, cfg.head_dim), self.tp, dt, name="c_attn")(x)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, T, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(cfg.head_dim)
        t = x.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        att = jax.nn.softmax(scores, axis=-1).astype(dt)
        y = jnp.einsum("bhqk,bkhd->bqhd", att, v)
        return RowParallel(cfg.n_embd, 2, proj_std(cfg), self.tp, dt, name="c_proj")(y)


class MLP(nn.Module):
    """GPT-2 MLP (4x hidden units, gelu tanh approximation) over this rank's hidden units."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        cfg, dt = self.cfg, self.cfg.compute_dtype
        hidden = 4 * cfg.n_embd // self.tp.size
        h = ColumnParallel((hidden,), self.tp, dt, name="c_fc")(x)
        h = jax.nn.gelu(h, approximate=True)
        return RowParallel(cfg.n_embd, 1, proj_std(cfg), self.tp, dt, name="c_proj")(h)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    cfg: GPTConfig
    tp: TensorParallel = TensorParallel()

    @nn.compact
    def __call__(self, x):
        eps = self.cfg.layer_norm_eps
        x = x + CausalSelfAttention(self.cfg, self.tp, name="attn")(LayerNorm(eps, name="ln_1")(x))
        return x + MLP(self.cfg, self.tp, name="mlp")(LayerNorm(eps, name="ln_2")(x))
