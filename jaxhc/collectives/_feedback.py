"""Error feedback (EF-SGD) for the lossy reductions: a residual in, a residual out.

Each rank sends ``y = x + residual`` (accumulated in float32; float64 for float64 inputs) and keeps
what the codec lost of it, ``y - decode(encode(y))``, as its next residual. In `psum` the owner of a
reduced chunk also keeps what the second encode lost of that chunk, added to its residual at the
chunk's place: one residual of x's shape carries both, and both return through the next send. Over
the ranks, ``out + sum(new residuals) == sum(x) + sum(old residuals)`` up to float32 rounding, so
nothing the codec drops is lost for good.

A raw transfer (no codec, a message under the policy's ``min_bytes``, or an agreed fallback after a
NaN/Inf or an MPC overflow) delivers ``y`` as x's dtype: the residual keeps only that cast's
rounding (zero for float32), and zero where it is not finite, so a NaN step cannot poison later
steps.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["carry", "check", "kept", "pairs", "residual_dtype"]


def residual_dtype(dtype) -> jnp.dtype:
    """The dtype a residual of `dtype` values has: float64 for float64, float32 otherwise."""
    return jnp.dtype(jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32)


def check(x, residual, where: str) -> None:
    """One-line error unless `residual` fits `x` (x's shape, `residual_dtype`, a float x)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{where}: residual= needs a float input, got {x.dtype}")
    want = residual_dtype(x.dtype)
    got_shape, got_dtype = tuple(getattr(residual, "shape", ())), getattr(residual, "dtype", None)
    if got_shape != tuple(x.shape) or got_dtype != want:
        raise ValueError(
            f"{where}: residual is {got_dtype}{list(got_shape)}; expected {want}{list(x.shape)}"
        )


def carry(x, residual):
    """(y = x + residual in the residual's dtype, y cast to x's dtype: what gets sent)."""
    y = x.astype(residual.dtype) + residual
    return y, y.astype(x.dtype)


def kept(y, sent):
    """The residual after `sent` moved raw: the cast's rounding, zero where not finite."""
    lost = y - sent.astype(y.dtype)
    return jnp.where(jnp.isfinite(lost), lost, jnp.zeros_like(lost))


def pairs(fn: Callable, x, residual, where: str):
    """Map `fn(leaf, residual_leaf) -> (out, new_residual)` over two trees of one structure."""
    leaves, tree = jax.tree.flatten(x)
    try:
        res_leaves = tree.flatten_up_to(residual)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: residual must have the tree structure of x") from None
    done = [fn(a, r) for a, r in zip(leaves, res_leaves, strict=True)]
    return tree.unflatten([d[0] for d in done]), tree.unflatten([d[1] for d in done])
