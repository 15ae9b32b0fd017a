"""`jaxhc profile`: this machine's codec speeds and, optionally, its device links, as a cluster.

Codecs: jaxhc's native encode and decode (XLA FFI, inside `jax.jit`) of a few MiB of float32
per device (a random walk, smooth at the scale of a ZFP block, as bench/codecs.py uses) on every
local device at once (they share this machine's cores, as a collective's codecs do), the best of
a few runs after a warm-up; GB/s of raw values per device. Links (``--links``): jaxhc's plain
all_gather over every local device (shard_map) at four message sizes (4 KiB to 2 MiB per
device); the ring model t = (k - 1) (latency + bytes / bandwidth) fitted through them (least
squares). Both go into a one-node cluster file the planner reads.
"""

from __future__ import annotations

import os
import time

import numpy as np

CODECS = ("zfp:8", "zfp:16", "q8", "mpc")


def _best(fn, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def walk(n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def codec_speeds(specs=CODECS, mib: float = 4.0, repeats: int = 3, devices=None) -> dict:
    """{spec: {"encode_gb_s", "decode_gb_s", "ratio"}} measured here, per device while every
    local device (`devices`, default all) encodes or decodes its own `mib` MiB at once: the
    devices of this machine share its cores, as the collectives' codecs do."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxhc.codecs import parse

    devs = list(devices or jax.devices())
    k = len(devs)
    n = max(1024, int(mib * 2**20) // 4)
    mesh = Mesh(np.asarray(devs), ("d",))
    spec = P("d")
    x = jax.device_put(walk(k * n), NamedSharding(mesh, spec))
    out = {}
    for name in specs:
        codec = parse(name)
        one = jax.jit(codec.encode)(x[:n])  # the payload's size and whether the data fit
        enc = jax.jit(
            jax.shard_map(
                lambda v, c=codec: c.encode(v).payload,
                mesh=mesh,
                in_specs=spec,
                out_specs=spec,
                check_vma=False,
            )
        )
        dec = jax.jit(
            jax.shard_map(
                lambda p, c=codec: c.decode(p, (n,), np.float32),
                mesh=mesh,
                in_specs=spec,
                out_specs=spec,
                check_vma=False,
            )
        )
        te = _best(lambda e=enc: e(x), repeats)
        td = float("nan")
        if bool(one.ok):
            payload = enc(x)
            td = _best(lambda d=dec, p=payload: d(p), repeats)
        out[codec.spec] = {
            "encode_gb_s": float(4 * n / te / 1e9),
            "decode_gb_s": float(4 * n / td / 1e9),
            "ratio": float(4 * n / int(one.nbytes)),
            "devices": k,
        }
    return out


def gather_seconds(values: int, repeats: int = 5, devices=None) -> tuple[float, int]:
    """(best seconds, ranks) of a plain jaxhc all_gather of `values` float32 per device over
    every local device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxhc

    devs = devices or jax.devices()
    k = len(devs)
    mesh = Mesh(np.asarray(devs), ("d",))
    f = jax.jit(
        jax.shard_map(
            lambda v: jaxhc.all_gather(v, "d", tiled=True),
            mesh=mesh,
            in_specs=P("d"),
            out_specs=P("d"),
            check_vma=False,
        )
    )
    x = jax.device_put(jnp.ones((k * values,), jnp.float32), NamedSharding(mesh, P("d")))
    return _best(lambda: f(x), repeats), k


LINK_SIZES = (2**10, 2**14, 2**17, 2**19)  # float32 values per device


def link_fit(sizes=LINK_SIZES, repeats: int = 5) -> dict:
    """Latency and bandwidth per device of the local devices' links: the least-squares fit of
    t = (k - 1) (latency + 4 values / bandwidth) through all-gathers of `sizes` values per
    device over every local device (jaxhc's host-memory reuse on, as `jaxhc train` runs)."""
    from jaxhc.host_memory import reuse_freed_memory

    reuse_freed_memory()
    times, k = [], 1
    for v in sizes:
        t, k = gather_seconds(v, repeats)
        times.append(t)
    if k < 2:
        raise ValueError("jaxhc profile --links needs at least 2 devices (--devices)")
    x = np.array([4.0 * v for v in sizes])
    y = np.array(times) / (k - 1)
    slope, icept = np.polyfit(x, y, 1)
    bw = 1 / slope if slope > 0 else float("inf")
    return {
        "gbit_s": float(bw * 8 / 1e9),
        "latency_us": float(max(0.0, icept) * 1e6),
        "ranks": k,
        "seconds": {str(v): t for v, t in zip(sizes, times, strict=True)},
    }


def memory_gib(devices: int) -> float:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size / 2**30 / devices
    except (ValueError, OSError):
        return 1.0


def profile(
    devices: int, mib: float = 4.0, repeats: int = 3, links: bool = False, specs=CODECS
) -> dict:
    """A cluster mapping (`jaxhc.plan.cluster.from_dict`) for this machine."""
    from jaxhc.host_memory import reuse_freed_memory
    from jaxhc.plan.cluster import LOCAL_DEFAULTS

    reuse_freed_memory()  # as `jaxhc train` runs: output buffers are not faulted in afresh
    speeds = codec_speeds(specs, mib, repeats)
    codecs = {
        k: {"encode_gb_s": round(v["encode_gb_s"], 4), "decode_gb_s": round(v["decode_gb_s"], 4)}
        for k, v in speeds.items()
        if np.isfinite(v["decode_gb_s"])
    }
    if links:
        fit = link_fit(repeats=repeats + 2)
        intra = {"gbit_s": round(fit["gbit_s"], 3), "latency_us": round(fit["latency_us"], 1)}
        how = f"links measured (all_gather over {fit['ranks']} devices)"
    else:
        intra = dict(LOCAL_DEFAULTS["links"]["intra"])
        how = "links: jaxhc.plan.cluster.LOCAL_DEFAULTS (not measured; --links measures them)"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "name": "local",
        "nodes": 1,
        "devices_per_node": devices,
        "memory_gib": round(memory_gib(devices), 2),
        "links": {"intra": intra},
        "codecs": codecs,
        "source": f"jaxhc profile: codecs measured ({mib:g} MiB float32 on each of {devices} "
        f"devices at once, best of {repeats}); "
        f"{how}; load average {load}",
    }
