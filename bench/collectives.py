"""Compressed collectives: time, raw and wire bytes per rank, and projected time on real links.

Runs each collective x codec x message size x P on P simulated host devices (one process), records
bytes with jaxhc's accounting, and projects the time of one call on links of 1, 10 and 100 Gbit/s
with an alpha-beta model:  t = codec_seconds + messages * alpha + wire_bytes / bandwidth,
where codec_seconds is the rank's encode + decode work at the codec throughput measured here
(single process, all cores) and messages is the ring algorithm's message count. On this machine
the devices share memory and two cores, so the measured time is codec-bound; the projection is
what a rank with this machine's codec speed would see on a bandwidth-limited link.

    python bench/collectives.py --out bench/results/collectives.json           # full sweep
    python bench/collectives.py --quick                                        # a minute or two
"""

from __future__ import annotations

import argparse
import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import markdown_table, print_table, timings, write_json  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.codecs import parse  # noqa: E402

LINKS_GBIT = (1, 10, 100)
ALPHA = 5e-6  # seconds per message (typical RDMA/TCP latency order)

# name -> (call, ring messages per rank, values encoded, values decoded), n local values, P ranks
COLLECTIVES = {
    "psum": (
        lambda x, a, c: jaxhc.psum(x, a, codec=c),
        lambda p: 2 * (p - 1),
        lambda n, p: n + n / p,
        lambda n, p: 2 * n,
    ),
    "all_gather": (
        lambda x, a, c: jaxhc.all_gather(x, a, tiled=True, codec=c),
        lambda p: p - 1,
        lambda n, p: n,
        lambda n, p: n * p,
    ),
    "psum_scatter": (
        lambda x, a, c: jaxhc.psum_scatter(x, a, tiled=True, codec=c),
        lambda p: p - 1,
        lambda n, p: n,
        lambda n, p: n,
    ),
    "ppermute": (
        lambda x, a, c: jaxhc.ppermute(
            x, a, [(i, (i + 1) % x_parts(a)) for i in range(x_parts(a))], codec=c
        ),
        lambda p: 1,
        lambda n, p: n,
        lambda n, p: n,
    ),
    "all_to_all": (
        lambda x, a, c: jaxhc.all_to_all(x, a, 0, 0, tiled=True, codec=c),
        lambda p: p - 1,
        lambda n, p: n,
        lambda n, p: n,
    ),
}


def x_parts(axis):
    return jaxhc.axis_size(axis)


def data(n_total: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return (rng.standard_normal(n_total) * 1e-3).astype(np.float32)
    # gradient-like: a smooth signal plus small noise (compressible, like real gradients)
    t = np.linspace(0, 50, n_total)
    return (np.sin(t) * 1e-2 + rng.standard_normal(n_total) * 1e-4).astype(np.float32)


def codec_speed(spec: str, n: int = 1 << 22) -> tuple[float, float]:
    """(encode, decode) throughput in values/s of `spec` on this machine."""
    if spec == "lax":
        return float("inf"), float("inf")
    codec = parse(spec)
    x = jnp.asarray(data(n, "smooth"))
    enc = jax.jit(codec.encode)
    payload = enc(x).payload
    dec = jax.jit(lambda p: codec.decode(p, (n,), jnp.float32))
    return n / timings(lambda: enc(x), 3)["median_s"], n / timings(lambda: dec(payload), 3)[
        "median_s"
    ]


def run_case(name, spec, nbytes, parts, kind):
    call, messages, n_enc, n_dec = COLLECTIVES[name]
    n = nbytes // 4
    n -= n % (parts * 4)
    mesh = Mesh(np.array(jax.devices()[:parts]), ("x",))
    x = jax.device_put(jnp.asarray(data(n * parts, kind)), NamedSharding(mesh, P("x")))
    codec = None if spec == "lax" else spec
    fn = jax.jit(
        jax.shard_map(lambda v: call(v, "x", codec), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    jax.block_until_ready(fn(x))  # compile outside the ledger
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(fn(x))
    per = ledger.per_axis(devices=parts)["x"]
    seconds = timings(lambda: fn(x), 3)["median_s"]
    return n, per, seconds, messages(parts), n_enc(n, parts), n_dec(n, parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="bench/results/collectives.json")
    ap.add_argument("--quick", action="store_true", help="few sizes, P=4 only")
    ap.add_argument("--codecs", default="lax,none,zfp:8,zfp:16,mpc:0.8")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--sizes-kb", default="64,1024,16384,65536")
    ap.add_argument("--parts", default="2,4,8")
    ap.add_argument("--data", choices=["smooth", "noise"], default="smooth")
    args = ap.parse_args()
    sizes = [64, 1024] if args.quick else [int(s) for s in args.sizes_kb.split(",")]
    parts_list = [4] if args.quick else [int(p) for p in args.parts.split(",")]
    specs = args.codecs.split(",")
    speeds = {s: codec_speed(s) for s in specs}

    results, rows = [], []
    for name in args.collectives.split(","):
        for parts in parts_list:
            for kb in sizes:
                for spec in specs:
                    n, per, seconds, msgs, enc_vals, dec_vals = run_case(
                        name, spec, kb * 1024, parts, args.data
                    )
                    enc_s, dec_s = speeds[spec]
                    codec_seconds = enc_vals / enc_s + dec_vals / dec_s
                    projected = {
                        g: codec_seconds + msgs * ALPHA + per["wire_bytes"] * 8 / (g * 1e9)
                        for g in LINKS_GBIT
                    }
                    rec = {
                        "collective": name,
                        "codec": spec,
                        "parts": parts,
                        "bytes_per_rank": n * 4,
                        "seconds": seconds,
                        **per,
                        "codec_seconds": codec_seconds,
                        "projected_seconds": projected,
                    }
                    results.append(rec)
                    rows.append(
                        [
                            name,
                            parts,
                            f"{n * 4 / 2**20:.2f}",
                            spec,
                            f"{seconds * 1e3:.2f}",
                            f"{per['raw_bytes'] / 2**20:.3f}",
                            f"{per['wire_bytes'] / 2**20:.3f}",
                            f"{per['raw_bytes'] / max(per['wire_bytes'], 1):.2f}",
                            int(per["fallbacks"]),
                            *[f"{projected[g] * 1e3:.2f}" for g in LINKS_GBIT],
                        ]
                    )
                    print(rows[-1], flush=True)
    columns = [
        "collective",
        "P",
        "MiB/rank",
        "codec",
        "ms here",
        "raw MiB",
        "wire MiB",
        "raw/wire",
        "fallbacks",
        *[f"ms @{g}Gb/s" for g in LINKS_GBIT],
    ]
    print_table("jaxhc collectives (per rank)", columns, rows)
    write_json(
        args.out,
        {
            "alpha_seconds": ALPHA,
            "links_gbit": LINKS_GBIT,
            "codec_values_per_second": speeds,
            "results": results,
            "markdown": markdown_table(columns, rows),
        },
    )


if __name__ == "__main__":
    main()
