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
at four sizes (`GROUP_VALUES`: 1 to 8 MiB per device); a latency and bandwidth per op and
k fitted through them (`fit_link`) go into ``links.collectives``. On XLA:CPU's in-process
collectives these differ by op and group size far more than one link's figures can say.

Compute (``compute``, what `jaxhc.plan.steptime` predicts a step's compute from): a float32
matrix product of a transformer layer's shape (`MATMUL`: tokens x width times width x 4 width)
and an AdamW update of a float32 vector (`UPDATE_VALUES` a device, the bytes it reads and writes:
`jaxhc.plan.steptime.UPDATE_BYTES` a value), on every local device at once, the best of a few
runs: FLOP/s and bytes/s per device.
"""

from __future__ import annotations

import os
import time

import numpy as np

from jaxhc.collectives import volume

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


def rounds(programs: dict, repeats: int) -> dict:
    """{key: [seconds of each run]} of `programs` ({key: a function making one jitted call}):
    each run once to warm up, then `repeats` rounds that run every program once in turn. The
    other jobs of a shared machine come and go; timed in rounds, every program sees the same
    spells of load (timed one after another, one can land wholly in a busy spell)."""
    import jax

    for fn in programs.values():
        jax.block_until_ready(fn())
    times: dict = {key: [] for key in programs}
    for _ in range(repeats):
        for key, fn in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[key].append(time.perf_counter() - t0)
    return times


def walk(n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def codec_programs(specs=CODECS, mib: float = 4.0, devices=None) -> tuple[dict, dict]:
    """The programs `codec_speeds` times, {(spec, "encode" | "decode"): call} (every local
    device coding its own `mib` MiB of float32 at once; no decode for a payload that does not
    fit), and {spec: (values per device, payload bytes, devices)}."""
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
    programs, facts = {}, {}
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
        programs[(codec.spec, "encode")] = lambda e=enc: e(x)
        if bool(one.ok):
            payload = enc(x)
            programs[(codec.spec, "decode")] = lambda d=dec, p=payload: d(p)
        facts[codec.spec] = (n, int(one.nbytes), k)
    return programs, facts


def codec_figures(times: dict, facts: dict) -> dict:
    """`codec_speeds`' result from the best of `rounds` over `codec_programs`."""
    out = {}
    for spec, (n, nbytes, k) in facts.items():
        te = min(times[(spec, "encode")])
        td = min(times[(spec, "decode")]) if (spec, "decode") in times else float("nan")
        out[spec] = {
            "encode_gb_s": float(4 * n / te / 1e9),
            "decode_gb_s": float(4 * n / td / 1e9),
            "ratio": float(4 * n / nbytes),
            "devices": k,
        }
    return out


def codec_speeds(specs=CODECS, mib: float = 4.0, repeats: int = 3, devices=None) -> dict:
    """{spec: {"encode_gb_s", "decode_gb_s", "ratio"}} measured here, per device while every
    local device (`devices`, default all) encodes or decodes its own `mib` MiB at once: the
    devices of this machine share its cores, as the collectives' codecs do."""
    programs, facts = codec_programs(specs, mib, devices)
    return codec_figures(rounds(programs, repeats), facts)


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
# float32 values of the op's larger buffer per device, 1 to 8 MiB: the messages of a data-parallel
# step beyond the caches (smaller ones move faster a byte here: a fit through both misses both);
# 16 MiB ones, with everything else a bench keeps alive, ran up to 2x slower a byte (measured)
GROUP_VALUES = (2**18, 2**19, 2**20, 2**21)


def ring_bytes(op: str, k: int, values: int) -> tuple[int, float]:
    """(latency steps, ring bytes per device) of `op` over k ranks whose larger buffer holds
    `values` float32 (an all-gather's output, the others' input)."""
    return volume.ring(op, k, 4 * values)


def group_programs(ops=GROUP_OPS, values=GROUP_VALUES, devices=None, sizes=None) -> dict:
    """The programs `group_fit` times: {(op, k, values): call} for each op of `ops` over groups
    of k consecutive devices (`sizes`, default every divisor > 1 of the local device count; all
    len(devices) / k groups at once) with `values` float32 in its larger buffer per device, and
    {("launch", k, input values): call} the same programs without the op (the first value back)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devs = list(devices or jax.devices())
    sizes = sizes or [k for k in range(2, len(devs) + 1) if len(devs) % k == 0]
    spec = P(("o", "g"))
    programs: dict = {}
    inputs: dict = {}

    def program(body, mesh, x):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
        return lambda: f(x)

    for k in sizes:
        mesh = Mesh(np.asarray(devs).reshape(-1, k), ("o", "g"))
        ops_of = {
            "all_gather": lambda v, k=k: lax.all_gather(v, "g", tiled=True),
            "psum_scatter": lambda v, k=k: lax.psum_scatter(v, "g", tiled=True),
            "all_to_all": lambda v, k=k: lax.all_to_all(v.reshape(k, -1), "g", 0, 0).reshape(-1),
            "psum": lambda v, k=k: lax.psum(v, "g"),
        }
        for v in values:
            for op in ops:
                size = v // k if op == "all_gather" else v
                if (k, size) not in inputs:
                    x = jnp.asarray(walk(len(devs) * size))
                    inputs[(k, size)] = jax.device_put(x, NamedSharding(mesh, spec))
                    programs[("launch", k, size)] = program(
                        lambda a: a[:1], mesh, inputs[(k, size)]
                    )
                programs[(op, k, v)] = program(ops_of[op], mesh, inputs[(k, size)])
    return programs


def op_seconds(times: dict, op: str, k: int, values: int) -> float:
    """One op's seconds from `rounds` over `group_programs`: the best run of its program less
    the best of the same program without it (its launch), 0 if that comes out below."""
    size = values // k if op == "all_gather" else values
    return max(min(times[(op, k, values)]) - min(times[("launch", k, size)]), 0.0)


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


def group_figures(times: dict) -> dict:
    """{op: {k: {"gbit_s", "latency_us", "seconds": {values: s}}}}: `fit_link` through
    `op_seconds` for every (op, k, values) that `rounds` timed of `group_programs`."""
    measured: dict = {}
    for key in times:
        if len(key) == 3 and key[0] in GROUP_OPS:  # rounds may time other programs too
            op, k, v = key
            measured.setdefault(op, {}).setdefault(k, []).append(v)
    out: dict = {}
    for op, by_k in measured.items():
        out[op] = {}
        for k, values in by_k.items():
            secs = [op_seconds(times, op, k, v) for v in values]
            fit = fit_link(op, k, values, secs)
            fit["seconds"] = {str(v): s for v, s in zip(values, secs, strict=True)}
            out[op][k] = fit
    return out


def group_fit(
    ops=GROUP_OPS, values=GROUP_VALUES, repeats: int = 5, devices=None, sizes=None
) -> dict:
    """`group_figures` of `group_programs` timed in `rounds`: what one node's collectives cost
    where a flat latency / bandwidth describes them badly (XLA:CPU's in-process collectives: a
    group of 2 or 4 among 8 devices is not a quarter of the full group's cost)."""
    from jaxhc.host_memory import reuse_freed_memory

    reuse_freed_memory()
    return group_figures(rounds(group_programs(ops, values, devices, sizes), repeats))


MATMUL = (1024, 768, 3072)  # (tokens, width, 4 width) of `compute_rates`' product
UPDATE_VALUES = 1 << 22  # float32 values per device of its update (16 MiB: beyond the caches)


def compute_programs(devices=None) -> tuple[dict, dict]:
    """The programs `compute_rates` times, {"matmul" | "update": call}, every local device
    running its own at once, and {key: FLOPs or bytes per device of one call}."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxhc.plan.steptime import UPDATE_BYTES

    devs = list(devices or jax.devices())
    k = len(devs)
    mesh = Mesh(np.asarray(devs), ("d",))
    spec = P("d")
    tok, width, ffn = MATMUL

    def put(x):
        return jax.device_put(x, NamedSharding(mesh, spec))

    def mapped(fn, n_in, out_specs=spec):
        return jax.jit(
            jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * n_in, out_specs=out_specs,
                          check_vma=False)
        )  # fmt: skip

    a = put(walk(k * tok * width).reshape(k * tok, width) / 1e3)
    b = put(walk(k * width * ffn, seed=1).reshape(k * width, ffn) / 1e3)
    matmul = mapped(lambda x, w: x @ w, 2)
    n = UPDATE_VALUES
    p, g = put(walk(k * n)), put(walk(k * n, seed=2) / 1e3)
    mu, nu = put(np.zeros(k * n, np.float32)), put(np.zeros(k * n, np.float32))

    def adamw(p, g, mu, nu):  # reads four vectors, writes three
        mu, nu = 0.9 * mu + 0.1 * g, 0.999 * nu + 0.001 * g * g
        return p - 1e-3 * (mu / (jnp.sqrt(nu) + 1e-8) + 0.1 * p), mu, nu

    update = mapped(adamw, 4, (spec,) * 3)
    programs = {"matmul": lambda: matmul(a, b), "update": lambda: update(p, g, mu, nu)}
    return programs, {"matmul": 2.0 * tok * width * ffn, "update": float(UPDATE_BYTES * n)}


def compute_rates(repeats: int = 3, devices=None) -> dict:
    """{"tflop_s", "memory_gb_s"} per device while every local device runs its own float32
    matrix product (`MATMUL`) or AdamW update (`UPDATE_VALUES`) at once: the devices of this
    machine share its cores, as the ranks of a step do."""
    programs, work = compute_programs(devices)
    times = rounds(programs, repeats)
    return {
        "tflop_s": float(work["matmul"] / min(times["matmul"]) / 1e12),
        "memory_gb_s": float(work["update"] / min(times["update"]) / 1e9),
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
    rates = compute_rates(repeats)
    compute = {"tflop_s": float(f"{rates['tflop_s']:.4g}"),
               "memory_gb_s": float(f"{rates['memory_gb_s']:.4g}")}  # fmt: skip
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "name": "local",
        "nodes": 1,
        "devices_per_node": devices,
        "memory_gib": round(memory_gib(devices), 2),
        "links": link_keys,
        "codecs": codecs,
        "compute": compute,
        "source": f"jaxhc profile: codecs measured ({mib:g} MiB float32 on each of {devices} "
        f"devices at once, best of {repeats}); compute measured (a float32 {MATMUL} matrix "
        f"product and an AdamW update of {UPDATE_VALUES} values a device, at once); "
        f"{how}; load average {load}",
    }
