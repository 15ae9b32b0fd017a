"""The CPU backend before jax starts it: how many host devices it has (`set_cpu_device_count`)
and which address its gloo collectives listen on (`use_gloo_address`, for `init_distributed`)."""

from __future__ import annotations

import jax


def set_cpu_device_count(n: int, environ=None) -> bool:
    """Give jax's CPU backend `n` devices, unless the user already chose or jax already started.

    The user chose when ``XLA_FLAGS`` holds ``--xla_force_host_platform_device_count``,
    ``JAX_NUM_CPU_DEVICES`` is set, or ``JAX_PLATFORMS`` names platforms without ``cpu``. Uses the
    ``jax_num_cpu_devices`` option (jax 0.4.38 and later; it would override ``XLA_FLAGS``, hence
    the check), else appends the XLA flag. Only the CPU backend is affected: an accelerator stays
    the default backend. Returns whether the count was set.

    >>> env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    >>> jaxhc.launch.set_cpu_device_count(4, env), env  # the user chose: left as it is
    (False, {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'})
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
