"""A GPT gradient pytree psum'd leaf by leaf vs in buckets: messages, compile and run time.

    .venv/bin/python bench/buckets.py                 # P = 4 host devices, lax / mpc / zfp:8
    .venv/bin/python bench/buckets.py --repeats 5 --out /tmp/b.json

The tree has the shapes of a GPT-2 model's parameters (--layers, --embd, --vocab, --block: 12
leaves per layer plus wte, wpe and ln_f; float32), filled with smooth gradient-like data, one
replica per rank (data parallelism). Each case runs
`jaxhc.psum(tree, "x", codec=..., bucket_bytes=...)` over P ranks (`--parts`, simulated host
devices, XLA transport): bucket_bytes None (one message and, for zfp, two agreement votes per
leaf, as before buckets), 1 MiB, and the default 32 MiB.

Columns: messages (ledger records per rank and call), compile s (lower + compile of the jitted
shard_map), ms best / ms median (wall time of one call over --repeats calls after a warm-up), raw
and wire MiB per rank (`jaxhc.accounting`). The machine's load average is recorded at the start and
the end: on a shared 2-core machine the times depend on it. JSON: bench/results/buckets.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def gpt_shapes(layers: int, embd: int, vocab: int, block: int) -> dict[str, tuple]:
    c = embd
    per_layer = {
        "ln_1/scale": (c,),
        "ln_1/bias": (c,),
        "attn/c_attn/kernel": (c, 3 * c),
        "attn/c_attn/bias": (3 * c,),
        "attn/c_proj/kernel": (c, c),
        "attn/c_proj/bias": (c,),
        "ln_2/scale": (c,),
        "ln_2/bias": (c,),
        "mlp/c_fc/kernel": (c, 4 * c),
        "mlp/c_fc/bias": (4 * c,),
        "mlp/c_proj/kernel": (4 * c, c),
        "mlp/c_proj/bias": (c,),
    }
    shapes = {"wte": (vocab, c), "wpe": (block, c)}
    for i in range(layers):
        shapes.update({f"h{i}/{k}": s for k, s in per_layer.items()})
    shapes.update({"ln_f/scale": (c,), "ln_f/bias": (c,)})
    return shapes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--codecs", default="lax,mpc,zfp:8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "buckets.json"))
    args = ap.parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.parts}"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxhc

    load_start = os.getloadavg()
    mesh = Mesh(np.array(jax.devices()[: args.parts]), ("x",))
    spec = P("x")
    shapes = gpt_shapes(args.layers, args.embd, args.vocab, args.block)
    rng = np.random.default_rng(0)
    tree = {}
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        t = np.linspace(0, 20, args.parts * n).reshape((args.parts,) + shape)
        scale = 1e-2 if "kernel" in name or name in ("wte", "wpe") else 1e-4
        noise = 0.05 * rng.standard_normal(t.shape)
        data = jnp.asarray(scale * (np.sin(t) + noise), jnp.float32)
        tree[name] = jax.device_put(data, NamedSharding(mesh, spec))
    total = sum(int(np.prod(s)) * 4 for s in shapes.values())
    rows = []
    for codec_name in args.codecs.split(","):
        codec = None if codec_name == "lax" else codec_name
        for bucket_bytes in (None, 2**20, 32 * 2**20):
            fn = jax.jit(
                jax.shard_map(
                    lambda t, c=codec, b=bucket_bytes: jaxhc.psum(t, "x", codec=c, bucket_bytes=b),
                    mesh=mesh,
                    in_specs=spec,
                    out_specs=spec,
                )
            )
            t0 = time.perf_counter()
            fn.lower(tree).compile()
            compile_s = time.perf_counter() - t0
            jax.block_until_ready(fn(tree))  # warm-up (and the compile of the call's cache entry)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(tree))
                times.append(time.perf_counter() - t0)
            with jaxhc.accounting.Ledger() as ledger:
                jax.block_until_ready(fn(tree))
                jax.effects_barrier()
            per = ledger.per_axis(devices=args.parts)["x"]
            rows.append(
                {
                    "codec": codec_name,
                    "bucket_bytes": bucket_bytes,
                    "messages": per["calls"],
                    "compile_s": compile_s,
                    "ms_best": 1e3 * min(times),
                    "ms_median": 1e3 * float(np.median(times)),
                    "raw_mib": per["raw_bytes"] / 2**20,
                    "wire_mib": per["wire_bytes"] / 2**20,
                    "fallbacks": per["fallbacks"],
                }
            )
            print(_line(rows[-1]), flush=True)
    out = {
        "command": "python bench/buckets.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "parts": args.parts,
        "leaves": len(shapes),
        "tree_mib": total / 2**20,
        "shapes": {k: list(v) for k, v in shapes.items()},
        "repeats": args.repeats,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "rows": rows,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{len(shapes)} leaves, {total / 2**20:.2f} MiB per rank, P = {args.parts}; "
        f"load average {load_start[0]:.1f} at the start, {out['load_average_end'][0]:.1f} at the "
        f"end; wrote {args.out}"
    )


def _line(r) -> str:
    bucket = "per leaf" if r["bucket_bytes"] is None else f"{r['bucket_bytes'] / 2**20:g} MiB"
    return (
        f"{r['codec']:>6} {bucket:>9}  messages {r['messages']:4.0f}"
        f"  compile {r['compile_s']:6.2f} s"
        f"  ms best {r['ms_best']:8.1f}  median {r['ms_median']:8.1f}"
        f"  raw {r['raw_mib']:6.2f} MiB  wire {r['wire_mib']:6.2f} MiB"
    )


if __name__ == "__main__":
    main()
