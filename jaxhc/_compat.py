"""Small shims over jax internals that moved between releases (jax 0.10.x and 0.11.x)."""

from __future__ import annotations

import jax
from jax import lax

try:  # a linear function with a custom transpose (public since jax 0.2; kept by 0.10)
    from jax.custom_derivatives import linear_call as linear_call
except ImportError:  # pragma: no cover - other jax versions
    from jax._src.custom_derivatives import linear_call as linear_call

AxisName = str | tuple[str, ...]


def axis_tuple(axis_name: AxisName) -> tuple[str, ...]:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def varying_axes(x) -> frozenset:
    """Mesh axes along which `x` varies under shard_map's type system (empty outside it)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        mat = getattr(aval, "manual_axis_type", None)
        vma = getattr(mat, "varying", None)
    return frozenset(vma or ())


def check_vma_enabled() -> bool:
    """Whether the enclosing shard_map tracks varying axes (``check_vma=True``)."""
    from jax._src import config

    flag = getattr(config, "_check_vma", None)
    if flag is None:  # gradients depend on it: refuse to guess
        raise RuntimeError(
            f"jaxhc cannot tell whether shard_map checks vma in jax {jax.__version__} "
            "(no jax._src.config._check_vma); please report this jax version"
        )
    return bool(flag.value)


def make_varying(x, axes) -> jax.Array:
    """Mark `x` as varying over `axes` (a no-op for axes it already varies over, or without vma)."""
    if not check_vma_enabled():
        return x
    missing = tuple(a for a in axes if a not in varying_axes(x))
    return lax.pcast(x, missing, to="varying") if missing else x


def axis_size(axis_name: AxisName) -> int:
    return int(lax.axis_size(axis_name))


def like(outputs, x):
    """Give `outputs` (a pytree) the shard_map "varying" type of `x`.

    An `ffi_call` result is typed invariant inside `shard_map(check_vma=True)` whatever its input;
    left so, a wrong `out_specs` would pass silently.
    """
    axes = tuple(varying_axes(x))
    return jax.tree.map(lambda y: make_varying(y, axes), outputs) if axes else outputs
