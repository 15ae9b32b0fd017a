"""Codec benchmark: encode/decode throughput, and MPC's compression ratio on realistic data.

    make bench                           # the full run: bench/results/codecs.json
    .venv/bin/python bench/codecs.py [--n 16777216] [--repeats 7] [--rates 4 8 16 24]
        [--dtypes float32 bfloat16] [--ratio-n 1048576] [--threads 1 all] [--out PATH]
    .venv/bin/python bench/codecs.py --quick   # a smoke run (seconds): codecs_quick.json

Throughput (first two tables). jaxhc's ZFP at each rate and MPC (dim 1, no budget) encode and
decode --n values (16M) of a random walk (cumsum of N(0, 1), smooth at the scale of a ZFP block)
through the XLA FFI inside `jax.jit`, side by side in one run with zfpy (single-threaded, float32
only: it has no bfloat16) and a numpy memcpy. GB/s are 1e9 bytes/s of uncompressed input as given
(a bfloat16 array counts 2 bytes per value), from the best of --repeats runs after one warm-up (the
JSON keeps the median and the CPU times too). "/zfpy" is our GB/s over zfpy's. "ratio" is raw
bytes / bytes the payload uses: rate-R ZFP stores R bits per value, so bfloat16 at rate 24 expands
(ratio < 1); MPC's ratio is what it achieved on this data. The first table is wall-clock time; the
second divides by the process CPU time instead (all threads), less sensitive to other jobs on the
machine but blind to parallel speed-up. Both tables come once per codec thread count (--threads:
1 and "all", the affinity mask's CPUs or JAXHC_THREADS): each count runs in its own process, since
the count is read once per process.

Compression ratio (third table). Lossless MPC, dims 1, 2 and 4, on float32 and bfloat16 copies of:
the weights of jaxhc's GPT (`jaxhc.model.gpt`, byte-level, 4 layers x 256 wide) at its GPT-2
initialization, their gradients for one batch of the embedded corpus, the residual stream after
each block (what pipeline stages send), a random walk, a smooth 2-D field, and white noise.
Ratio = raw bytes / bytes used, summed over a data set's arrays. A payload budget b (`mpc:b`)
fits when ratio >= 1/b; below that a collective falls back to sending raw.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import zfpy
from _common import fmt, gbps, markdown_table, print_table, time_codec, timings, write_json

from jaxhc import _native
from jaxhc.codecs import Mpc, Zfp

ZFP_RATES = (4, 8, 16, 24)
DTYPES = ("float32", "bfloat16")
MPC_DIMS = (1, 2, 4)


def random_walk(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


# --- throughput ------------------------------------------------------------------------------


def bench_zfpy(x: np.ndarray, rate: float, repeats: int) -> dict:
    stream = zfpy.compress_numpy(x, rate=rate, write_header=False)
    ztype, shape = zfpy.dtype_to_ztype(x.dtype), list(x.shape)
    return {
        "encode": timings(lambda: zfpy.compress_numpy(x, rate=rate, write_header=False), repeats),
        "decode": timings(lambda: zfpy._decompress(stream, ztype, shape, rate=rate), repeats),
        "ratio": x.nbytes / len(stream),
    }


def throughput(n: int, repeats: int, rates, dtypes) -> list[dict]:
    """One record per (codec, dtype): jaxhc's timings, zfpy's for ZFP on float32, and memcpy."""
    base = random_walk(n)
    threads = _native.cpu.threads()
    records = []
    for dtype in dtypes:
        x_np = base.astype(jnp.dtype(dtype))
        x = jax.device_put(x_np)
        for codec in [*(Zfp(rate=r) for r in rates), Mpc()]:
            rec = {"codec": codec.spec, "dtype": dtype, "bytes": x_np.nbytes, "threads": threads}
            rec["jaxhc"] = time_codec(codec, x, repeats)
            if isinstance(codec, Zfp) and dtype == "float32":
                rec["zfpy"] = bench_zfpy(x_np, codec.rate, repeats)
            records.append(rec)
        dst = np.empty_like(x_np)
        copy = timings(lambda: np.copyto(dst, x_np), repeats)  # noqa: B023 - called right here
        records.append(
            {
                "codec": "memcpy",
                "dtype": dtype,
                "bytes": x_np.nbytes,
                "threads": 1,
                "numpy": {"encode": copy, "decode": copy},
            }
        )
    return records


THROUGHPUT_COLUMNS = [
    "codec",
    "dtype",
    "ratio",
    "enc GB/s",
    "dec GB/s",
    "zfpy enc",
    "zfpy dec",
    "enc/zfpy",
    "dec/zfpy",
]


def throughput_rows(records: list[dict], key: str) -> list[list[str]]:
    """GB/s from the `key` seconds ("s": best wall time, "cpu_s": CPU time) and ours / zfpy's."""
    rows = []
    for r in records:
        ours, z = r.get("jaxhc") or r["numpy"], r.get("zfpy")
        enc, dec = (gbps(r["bytes"], ours[op] and ours[op][key]) for op in ("encode", "decode"))
        zenc, zdec = (gbps(r["bytes"], z[op][key]) if z else None for op in ("encode", "decode"))
        vs = [a / b if a and b else None for a, b in ((enc, zenc), (dec, zdec))]
        rows.append(
            [
                r["codec"],
                r["dtype"],
                fmt(ours["ratio"], "{:.3f}") if "ratio" in ours else "",
                *(fmt(v, "{:.3f}") for v in (enc, dec, zenc, zdec)),
                *(fmt(v, "{:.2f}x") for v in vs),
            ]
        )
    return rows


# --- MPC compression ratio -------------------------------------------------------------------


def gpt_sets(quick: bool, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """jaxhc's GPT at init: weights, gradients of one corpus batch, residual stream per block."""
    from jaxhc.data import Batches, corpus_bytes
    from jaxhc.model import GPTConfig, gpt
    from jaxhc.model.layers import Block

    cfg = GPTConfig(
        vocab_size=256,
        block_size=64 if quick else 128,
        n_layer=2 if quick else 4,
        n_head=4,
        n_embd=128 if quick else 256,
    )
    params = gpt.init_params(cfg, seed)
    tokens = jnp.asarray(Batches(corpus_bytes(), 4 if quick else 16, cfg.block_size, seed).train(0))
    grads = jax.grad(gpt.loss)(params, tokens, cfg)
    block = Block(cfg)

    def layer(h, p):
        h = block.apply({"params": p}, h)
        return h, h

    _, acts = jax.lax.scan(layer, gpt.embed(params, tokens[:, :-1], cfg), params["blocks"])
    leaves = lambda tree: [np.asarray(a, np.float32) for a in jax.tree.leaves(tree)]  # noqa: E731
    return {
        "gpt weights": leaves(params),
        "gpt gradients": leaves(grads),
        "gpt activations": list(np.asarray(acts, np.float32)),
    }


def ratio_sets(n: int, quick: bool, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Data set name -> float32 arrays."""
    rng = np.random.default_rng(seed)
    side = int(np.sqrt(n))
    u, v = np.meshgrid(np.linspace(0, 4, side), np.linspace(0, 3, side))
    field = np.sin(3 * u) * np.cos(2 * v) + np.exp(-((u - 2) ** 2 + (v - 1.5) ** 2))
    return {
        **gpt_sets(quick, seed),
        "random walk": [random_walk(n, seed + 1)],
        "smooth 2-D field": [field.astype(np.float32)],
        "white noise": [rng.standard_normal(n).astype(np.float32)],
    }


def mpc_ratios(sets: dict[str, list[np.ndarray]], dtypes, dims=MPC_DIMS) -> list[dict]:
    records = []
    for name, arrays in sets.items():
        for dtype in dtypes:
            xs = [jnp.asarray(a, dtype) for a in arrays]
            raw = sum(x.nbytes for x in xs)
            ratios = {}
            for dim in dims:
                codec = Mpc(dim=dim)
                ratios[f"dim{dim}"] = raw / sum(int(codec.encode(x).nbytes) for x in xs)
            records.append(
                {
                    "data": name,
                    "dtype": dtype,
                    "arrays": len(xs),
                    "values": sum(x.size for x in xs),
                    "ratio": ratios,
                }
            )
    return records


def ratio_table(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    dims = list(records[0]["ratio"])
    columns = [
        "data",
        "dtype",
        "arrays",
        "values",
        *(f"MPC {d.replace('dim', 'dim ')}" for d in dims),
    ]
    rows = [
        [r["data"], r["dtype"], r["arrays"], r["values"], *(f"{r['ratio'][d]:.3f}" for d in dims)]
        for r in records
    ]
    return columns, rows


def throughput_with_threads(setting: str, args) -> list[dict]:
    """`throughput` in a child process whose codecs use `setting` threads ("all": the default)."""
    env = dict(os.environ)
    env.pop("JAXHC_THREADS", None)
    if setting != "all":
        env["JAXHC_THREADS"] = setting
    cmd = [sys.executable, os.path.abspath(__file__), "--throughput-json", "--n", str(args.n)]
    cmd += ["--repeats", str(args.repeats), "--rates", *map(str, args.rates)]
    cmd += ["--dtypes", *args.dtypes]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"throughput with threads={setting} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1 << 24, help="values per array (default 16M)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (best kept)")
    ap.add_argument("--rates", type=float, nargs="+", default=ZFP_RATES, help="ZFP rates")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--ratio-n", type=int, default=1 << 20, help="values per synthetic ratio set")
    ap.add_argument(
        "--threads",
        nargs="+",
        default=["1", "all"],
        help='codec thread counts to time, each in its own process ("all": the default count)',
    )
    ap.add_argument("--throughput-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="1M values, 2 repeats, a smaller GPT")
    ap.add_argument("--out", help="JSON path (default bench/results/codecs[_quick].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats, args.ratio_n = 1 << 20, 2, 1 << 16

    if args.throughput_json:  # the child process of throughput_with_threads
        print(json.dumps(throughput(args.n, args.repeats, args.rates, args.dtypes)))
        return

    what = f"{args.n} values, best of {args.repeats}, GB/s of input, {jax.devices()[0]}"
    notes = [
        "zfpy has no bfloat16: its columns are n/a there.",
        "ratio: raw / used bytes (MPC: achieved on this random walk).",
    ]
    records, tables = [], {}
    for setting in args.threads:
        recs = throughput_with_threads(setting, args)
        records += recs
        threads = recs[0]["threads"]
        for key, title in (("s", "wall clock"), ("cpu_s", "per CPU-second")):
            rows = throughput_rows(recs, key)
            name = f"codec throughput, {threads} thread{'s' if threads > 1 else ''}, {title}"
            print_table(f"{name}: {what}", THROUGHPUT_COLUMNS, rows, notes)
            tables[f"{key}_threads{setting}"] = markdown_table(THROUGHPUT_COLUMNS, rows, notes)

    ratios = mpc_ratios(ratio_sets(args.ratio_n, args.quick), args.dtypes)
    columns, rows = ratio_table(ratios)
    notes = [
        "ratio = raw bytes / bytes used, over all arrays of a data set; budget b fits when "
        "ratio >= 1/b."
    ]
    print_table("MPC compression ratio (lossless)", columns, rows, notes)
    tables["mpc_ratio"] = markdown_table(columns, rows, notes)

    out = args.out or f"bench/results/codecs{'_quick' if args.quick else ''}.json"
    write_json(
        out,
        {
            "n": args.n,
            "repeats": args.repeats,
            "threads": args.threads,
            "ratio_n": args.ratio_n,
            "throughput_data": "random walk (cumsum of N(0,1)) in float32, then cast",
            "throughput": records,
            "mpc_ratio": ratios,
            "markdown": tables,
        },
    )


if __name__ == "__main__":
    main()
