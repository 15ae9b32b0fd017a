"""Argument checks shared across jaxhc: one-line errors that name the culprit."""

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


def whole_number(key: str, value, least: int = 1) -> None:
    """`value` (of config key `key`) must be an int, not a bool, and at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        need = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"{key}={value!r} must be {need}")
