"""`jaxhc profile`: this machine's codec speeds and, optionally, its device links, as a cluster.

Codecs: jaxhc's native encode and decode (XLA FFI, inside `jax.jit`) of a few MiB of float32
per device (a random walk, smooth at the scale of a ZFP block, as bench/codecs.py uses) on every
local device at once (they share this machine's cores, as a collective's codecs do), the best of
a few runs after a warm-up; GB/s of raw values per device. Links (``--links``): jaxhc's plain
all_gather over every local device (shard_map) at four message sizes (4 KiB to 2 MiB per
device); the ring model t = (k - 1) (latency + bytes / bandwidth) fitted through them (least
squares). Both go into a one-node cluster file the planner reads.

``--links`` also measures the collectives a step runs (`GROUP_OPS`: all-gather, reduce-scatter,
the all-to-all that moves a compressed reduce-scatter's payloads, all-reduce) over groups of
every size k dividing the local devices, all groups at once (every device busy, as a data
sub-axis runs): one op in a jitted program less the same program without it, best of a few runs,
at four sizes (`GROUP_VALUES`: 256 KiB to 16 MiB per device); a latency and bandwidth per op and
k fitted through them (`fit_link`) go into ``links.collectives``. On XLA:CPU's in-process
collectives these differ by op and group size far more than one link's figures can say.
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


# The collectives `group_fit` times on this machine, and the ring steps of each one's latency
# term: jaxhc's XLA transport moves a compressed reduce-scatter's payloads by an all-to-all and
# agrees on its fallback flag by a tiny all-reduce (the "psum" entry's latency).
GROUP_OPS = ("all_gather", "psum_scatter", "all_to_all", "psum")
GROUP_VALUES = (2**16, 2**19, 2**21, 2**22)  # float32 values of the op's larger buffer, per device


def ring_bytes(op: str, k: int, values: int) -> tuple[int, float]:
    """(latency steps, ring bytes per device) of `op` over k ranks whose larger buffer holds
    `values` float32 (an all-gather's output, the others' input)."""
    n = 4 * values
    return {
        "all_gather": (k - 1, (k - 1) / k * n),
        "psum_scatter": (k - 1, (k - 1) / k * n),
        "all_to_all": (k - 1, (k - 1) / k * n),
        "psum": (2 * (k - 1), 2 * (k - 1) / k * n),
    }[op]


def _op_program(op: str | None, k: int, values: int, devices):
    """A jitted program of one `op` over groups of k consecutive devices (all local devices at
    once, len(devices) / k groups; None: no op, the first value back) and its input."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.asarray(devices).reshape(-1, k), ("o", "g"))
    size = values // k if op == "all_gather" else values

    def body(v):
        if op == "all_gather":
            return lax.all_gather(v, "g", tiled=True)
        if op == "psum_scatter":
            return lax.psum_scatter(v, "g", tiled=True)
        if op == "all_to_all":
            return lax.all_to_all(v.reshape(k, -1), "g", 0, 0).reshape(-1)
        if op == "psum":
            return lax.psum(v, "g")
        return v[:1]

    spec = P(("o", "g"))
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    x = jax.device_put(jnp.asarray(walk(len(devices) * size)), NamedSharding(mesh, spec))
    return lambda: f(x)


def op_seconds(op: str, k: int, values: int, repeats: int = 5, devices=None) -> float:
    """Seconds of one `op` over groups of k consecutive local devices (every device busy, as a
    data sub-axis runs) with `values` float32 in its larger buffer per device: the best run of a
    program of that op less the best of the same program without it (its launch)."""
    import jax

    devs = list(devices or jax.devices())
    with_op = _best(_op_program(op, k, values, devs), repeats)
    launch = _best(_op_program(None, k, values, devs), repeats)
    return max(with_op - launch, 0.0)


def fit_link(op: str, k: int, values, seconds) -> dict:
    """Latency and bandwidth of t = steps x latency + ring bytes / bandwidth (`ring_bytes`)
    through the (values, seconds) whose seconds are > 0 (a difference of two runs can come out
    0), least squares in relative error; a negative latency is refitted as 0."""
    pts = [(ring_bytes(op, k, v), t) for v, t in zip(values, seconds, strict=True) if t > 0]
    if len(pts) < 2:
        raise ValueError(f"profile: {op} over {k} ranks: fewer than 2 sizes took measurable time")
    a = np.array([[steps, wire] for (steps, wire), _ in pts], float)
    t = np.array([s for _, s in pts], float)
    w = 1 / t
    (lat, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if lat < 0:
        lat = 0.0
        inv_bw = float(np.sum(a[:, 1] * t * w * w) / np.sum((a[:, 1] * w) ** 2))
    bw = 1 / inv_bw if inv_bw > 0 else float("inf")
    return {"gbit_s": float(bw * 8 / 1e9), "latency_us": float(lat * 1e6)}


def group_fit(
    ops=GROUP_OPS, values=GROUP_VALUES, repeats: int = 5, devices=None, sizes=None
) -> dict:
    """{op: {k: {"gbit_s", "latency_us", "seconds": {values: s}}}}: each collective of `ops` timed
    (`op_seconds`) over groups of every size k (`sizes`, default every divisor > 1 of the local
    device count) at `values`, and `fit_link` through the times. What one node's collectives cost
    where a flat latency / bandwidth describes them badly (XLA:CPU's in-process collectives: a
    group of 2 or 4 among 8 devices is not a quarter of the full group's cost)."""
    import jax

    from jaxhc.host_memory import reuse_freed_memory

    reuse_freed_memory()
    devs = list(devices or jax.devices())
    sizes = sizes or [k for k in range(2, len(devs) + 1) if len(devs) % k == 0]
    out: dict = {}
    for op in ops:
        out[op] = {}
        for k in sizes:
            secs = [op_seconds(op, k, v, repeats, devs) for v in values]
            fit = fit_link(op, k, values, secs)
            fit["seconds"] = {str(v): s for v, s in zip(values, secs, strict=True)}
            out[op][k] = fit
    return out


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
        table = {
            op: {
                k: {x: float(f"{f[x]:.4g}") for x in ("gbit_s", "latency_us")}
                for k, f in ks.items()
            }
            for op, ks in group_fit(repeats=repeats + 2).items()
        }
        how = (
            f"links measured (all_gather over {fit['ranks']} devices; links.collectives: "
            f"{', '.join(GROUP_OPS)} over groups of every size at once, one op less its launch)"
        )
        link_keys = {"intra": intra, "collectives": table}
    else:
        intra = dict(LOCAL_DEFAULTS["links"]["intra"])
        how = "links: jaxhc.plan.cluster.LOCAL_DEFAULTS (not measured; --links measures them)"
        link_keys = {"intra": intra}
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "name": "local",
        "nodes": 1,
        "devices_per_node": devices,
        "memory_gib": round(memory_gib(devices), 2),
        "links": link_keys,
        "codecs": codecs,
        "source": f"jaxhc profile: codecs measured ({mib:g} MiB float32 on each of {devices} "
        f"devices at once, best of {repeats}); "
        f"{how}; load average {load}",
    }
