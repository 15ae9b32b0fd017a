"""Argument checks shared by the collectives and the transports (jax.lax's rules, clear errors)."""

from __future__ import annotations


def split_dim(x, dim: int, tiled: bool, parts: int, where: str, name: str = "dimension") -> int:
    """Normalize `dim` of `x` that a collective splits into `parts` (equal to it unless tiled)."""
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{where}: {name} {dim} out of range for shape {x.shape}")
    dim %= x.ndim
    size = x.shape[dim]
    if (tiled and size % parts) or (not tiled and size != parts):
        need = f"a multiple of {parts}" if tiled else f"equal to the axis size {parts}"
        raise ValueError(f"{where}: dimension {dim} of shape {x.shape} must be {need}")
    return dim
