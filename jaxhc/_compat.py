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


def set_cpu_device_count(n: int, environ=None) -> bool:
    """Give jax's CPU backend `n` devices, unless the user already chose or jax already started.

    The user chose when ``XLA_FLAGS`` holds ``--xla_force_host_platform_device_count``,
    ``JAX_NUM_CPU_DEVICES`` is set, or ``JAX_PLATFORMS`` names platforms without ``cpu``. Uses the
    ``jax_num_cpu_devices`` option (jax 0.4.38 and later; it would override ``XLA_FLAGS``, hence
    the check), else appends the XLA flag. Only the CPU backend is affected: an accelerator stays
    the default backend. Returns whether the count was set.
    """
    import os

    env = os.environ if environ is None else environ
    platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    chosen = (
        "xla_force_host_platform_device_count" in env.get("XLA_FLAGS", "")
        or env.get("JAX_NUM_CPU_DEVICES")
        or (platforms and "cpu" not in platforms)
    )
    if chosen or _backends_started():
        return False
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except AttributeError:  # pragma: no cover - a jax without the option
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
    return True


def _backends_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # pragma: no cover - other jax versions
        return False


def use_gloo_address(hostname: str | None = None, interface: str | None = None) -> None:
    """Make the CPU backend's gloo collectives listen on `hostname` (a name or an IP address) or on
    the first address of network `interface`, instead of what this machine's host name resolves to.

    jax builds its gloo collectives with neither (jax 0.10: `xla_bridge.make_cpu_client`), so gloo
    resolves `gethostname()`; jaxlib's `make_gloo_tcp_collectives` takes both. This registers a CPU
    backend factory that passes them; call it after `jax.distributed.initialize` and before
    anything starts jax's backends.
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("use_gloo_address: jax's backends are already initialized")

    def make_cpu_client():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client,
            hostname=hostname,
            interface=interface,
        )
        return xla_bridge.make_cpu_client(collectives)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)
