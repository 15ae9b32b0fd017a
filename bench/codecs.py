"""Codec benchmark: encode/decode throughput, and MPC's compression ratio on realistic data.

    make bench                           # the full run: bench/results/codecs.json
    .venv/bin/python bench/codecs.py [--n 16777216] [--repeats 7] [--rounds 3] [--rates 4 8 16 24]
        [--nd-rates 8] [--dtypes float32 bfloat16] [--ratio-n 1048576] [--out PATH]
    .venv/bin/python bench/codecs.py --quick   # a smoke run (seconds): codecs_quick.json

Throughput (first two tables). jaxhc's ZFP at each rate (1-D blocks), ZFP in 2-D and 3-D blocks at
each --nd-rates rate (`zfp:R:d2`, `zfp:R:d3`), q8, q4, q8:h, q4:h and MPC (dim 1, no budget) encode
and decode --n values (16M) of a random walk (cumsum of N(0, 1), smooth at the scale of a ZFP block)
through the XLA FFI inside `jax.jit`, side by side in one run with zfpy (single-threaded, float32
only: it has no bfloat16; for 2-D/3-D blocks the (n/4, 4) and (n/16, 4, 4) arrays whose streams
jaxhc's are) and a numpy memcpy. "1 thr" columns come from a child process pinned to
one CPU with JAXHC_THREADS=1 (zfpy is timed there too, so "/zfpy" compares one core with one core);
"all" columns use every thread this process may run. "all/1" is the threads' speed-up. The two
take turns, --rounds times (3: all threads, then the one-thread child, and again), so that both
see the machine in the same states (other jobs on a shared machine come and go).
Both processes reuse freed host memory (jaxhc.host_memory, as `jaxhc train` does), so an output
buffer is not faulted in afresh on every call; --no-memory-reuse measures glibc's default instead.
GB/s are 1e9 bytes/s of uncompressed input as given (a bfloat16 array counts 2 bytes per value),
from the best of --repeats runs after one warm-up over all rounds (the JSON keeps each round's
best, the median of the rounds' medians and the CPU times too). "ratio" is raw bytes / bytes the
payload uses: rate-R ZFP stores R bits per value, so bfloat16 at rate 24 expands (ratio < 1);
MPC's ratio is what it achieved on this data. The first table is wall-clock time; the second
divides by the CPU time instead (all threads), less sensitive to other jobs on the machine but
blind to parallel speed-up.

Fused decode-and-sum (third table). What a compressed psum decodes after its reduce-scatter: P
payloads of n / P values (rate 8, float32) summed in rank order by `Zfp.decode_sum`, against
decoding the P rows and adding them (the generic `Codec.decode_sum`); GB/s of decoded values.

Compression ratio (fourth table). Lossless MPC, dims 1, 2 and 4, on float32 and bfloat16 copies of:
the weights of jaxhc's GPT (`jaxhc.model.gpt`, byte-level, 4 layers x 256 wide) at its GPT-2
initialization, their gradients for one batch of the embedded corpus, the residual stream after
each block (what pipeline stages send), a random walk, a smooth 2-D field, and white noise.
Ratio = raw bytes / bytes used, summed over a data set's arrays. A payload budget b (`mpc:b`)
fits when ratio >= 1/b; below that a collective falls back to sending raw.

Accuracy (fifth table, bench/accuracy.py, also runnable alone): every lossy codec and the
bfloat16/float16 casts on the GPT sets, bits per value, relative L2 and max error, and the
one-thread encode/decode GB/s of q8/q4 and q8:h/q4:h.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import accuracy
import jax
import jax.numpy as jnp
import numpy as np
import zfpy
from _common import fmt, gbps, markdown_table, print_table, time_codec, timings, write_json
from _sets import gpt_sets

from jaxhc import host_memory
from jaxhc.codecs import Codec, Mpc, Quant, Zfp

ZFP_RATES = (4, 8, 16, 24)
ND_RATES = (8,)
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


def throughput(
    n: int, repeats: int, rates, dtypes, with_zfpy: bool, nd_rates=ND_RATES
) -> list[dict]:
    """One record per (codec, dtype): jaxhc's timings, zfpy's for ZFP on float32 (2-D/3-D blocks:
    on the array shape whose stream jaxhc's is, when n is a multiple of the block), and memcpy."""
    base = random_walk(n)
    records = []
    nd = [Zfp(rate=r, dims=d) for r in nd_rates for d in (2, 3)]
    for dtype in dtypes:
        x_np = base.astype(jnp.dtype(dtype))
        x = jax.device_put(x_np)
        quant = [Quant(8), Quant(4), Quant(8, rotate=True), Quant(4, rotate=True)]
        for codec in [*(Zfp(rate=r) for r in rates), *nd, *quant, Mpc()]:
            rec = {"codec": codec.spec, "dtype": dtype, "bytes": x_np.nbytes}
            rec["jaxhc"] = time_codec(codec, x, repeats)
            zfp = isinstance(codec, Zfp) and dtype == "float32"
            if with_zfpy and zfp and n % codec.block_values == 0:
                shape = (-1, *(4,) * (codec.dims - 1))  # zfp's x is the last axis
                rec["zfpy"] = bench_zfpy(x_np.reshape(shape), codec.rate, repeats)
            records.append(rec)
        dst = np.empty_like(x_np)
        copy = timings(lambda: np.copyto(dst, x_np), repeats)  # noqa: B023 - called right here
        records.append(
            {
                "codec": "memcpy",
                "dtype": dtype,
                "bytes": x_np.nbytes,
                "numpy": {"encode": copy, "decode": copy},
            }
        )
    return records


def one_thread(args) -> list[dict]:
    """`throughput` (zfpy included) in a child process pinned to one CPU (taskset), with
    JAXHC_THREADS=1."""
    cpu = min(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "one_thread.json")
        cmd = ["taskset", "-c", str(cpu), sys.executable, os.path.abspath(__file__)]
        cmd += ["--one-thread-child", out]
        cmd += ["--n", str(args.n), "--repeats", str(args.repeats), "--dtypes", *args.dtypes]
        cmd += ["--rates", *map(str, args.rates)]
        cmd += ["--nd-rates", *map(str, args.nd_rates)]
        cmd += ["--no-memory-reuse"] if args.no_memory_reuse else []
        subprocess.run(
            cmd,
            env={**os.environ, "JAXHC_THREADS": "1"},
            check=True,
        )
        with open(out) as f:
            return json.load(f)


def best_of_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One record list from the same measurements taken in several rounds: each timing (encode,
    decode of jaxhc, zfpy, numpy) is the best "s" and "cpu_s" over the rounds, the median of their
    "median_s", and keeps every round's best ("rounds_s")."""

    def timing(ts: list) -> dict | None:
        if any(t is None for t in ts):
            return None
        return {
            "s": min(t["s"] for t in ts),
            "median_s": statistics.median(t["median_s"] for t in ts),
            "cpu_s": min(t["cpu_s"] for t in ts),
            "rounds_s": [t["s"] for t in ts],
        }

    out = []
    for recs in zip(*rounds, strict=True):
        r = dict(recs[0])
        for who in ("jaxhc", "zfpy", "numpy"):
            if who in r:
                r[who] = dict(r[who])
                for op in ("encode", "decode"):
                    r[who][op] = timing([x[who][op] for x in recs])
        out.append(r)
    return out


def merge_one_thread(records: list[dict], child: list[dict]) -> None:
    """Give each record the child's timings ("one_thread") and its zfpy timings."""
    by_key = {(r["codec"], r["dtype"]): r for r in child}
    for r in records:
        c = by_key[(r["codec"], r["dtype"])]
        r["one_thread"] = c.get("jaxhc") or c["numpy"]
        if "zfpy" in c:
            r["zfpy"] = c["zfpy"]


THROUGHPUT_COLUMNS = [
    "codec",
    "dtype",
    "ratio",
    "enc 1 thr",
    "dec 1 thr",
    "enc all",
    "dec all",
    "zfpy enc",
    "zfpy dec",
    "enc/zfpy",
    "dec/zfpy",
    "enc all/1",
    "dec all/1",
]


def throughput_rows(records: list[dict], key: str) -> list[list[str]]:
    """GB/s from the `key` seconds ("s": best wall time, "cpu_s": CPU time), one thread and all,
    ours over zfpy's (one thread each) and all threads over one."""
    rows = []
    for r in records:
        ours, one, z = r.get("jaxhc") or r["numpy"], r["one_thread"], r.get("zfpy")
        gb = {
            (who, op): gbps(r["bytes"], t[op] and t[op][key]) if t else None
            for who, t in (("all", ours), ("one", one), ("zfpy", z))
            for op in ("encode", "decode")
        }
        ratio = lambda a, b: a / b if a and b else None  # noqa: E731
        rows.append(
            [
                r["codec"],
                r["dtype"],
                fmt(ours["ratio"], "{:.3f}") if "ratio" in ours else "",
                *(
                    fmt(gb[w, op], "{:.3f}")
                    for w in ("one", "all", "zfpy")
                    for op in ("encode", "decode")
                ),
                *(
                    fmt(ratio(gb["one", op], gb["zfpy", op]), "{:.2f}x")
                    for op in ("encode", "decode")
                ),
                *(
                    fmt(ratio(gb["all", op], gb["one", op]), "{:.2f}x")
                    for op in ("encode", "decode")
                ),
            ]
        )
    return rows


# --- fused decode-and-sum ----------------------------------------------------------------------


def decode_sum_records(n: int, repeats: int, parts_list=(2, 4, 8)) -> list[dict]:
    codec = Zfp(rate=8)
    records = []
    for parts in parts_list:
        m = n // parts
        rows = jnp.asarray(random_walk(parts * m).reshape(parts, m))
        payloads = jax.block_until_ready(jax.jit(jax.vmap(codec.encode))(rows).payload)
        fused = jax.jit(lambda p, m=m: codec.decode_sum(p, m, jnp.float32))
        unfused = jax.jit(lambda p, m=m: Codec.decode_sum(codec, p, m, jnp.float32))
        if np.asarray(fused(payloads)).tobytes() != np.asarray(unfused(payloads)).tobytes():
            raise AssertionError(f"decode_sum differs from decode then sum for P={parts}")
        records.append(
            {
                "parts": parts,
                "values": parts * m,
                "fused": timings(lambda f=fused: f(payloads), repeats),  # noqa: B023
                "unfused": timings(lambda f=unfused: f(payloads), repeats),  # noqa: B023
            }
        )
    return records


DECODE_SUM_COLUMNS = ["P", "values", "fused GB/s", "decode+sum GB/s", "fused/unfused"]


def decode_sum_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        fused, unfused = (gbps(4 * r["values"], r[k]["s"]) for k in ("fused", "unfused"))
        rows.append(
            [r["parts"], r["values"], f"{fused:.3f}", f"{unfused:.3f}", f"{fused / unfused:.2f}x"]
        )
    return rows


# --- MPC compression ratio -------------------------------------------------------------------


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1 << 24, help="values per array (default 16M)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (best kept)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (all threads, then the one-thread child); best over the rounds kept",
    )
    ap.add_argument("--rates", type=float, nargs="+", default=ZFP_RATES, help="ZFP rates")
    ap.add_argument(
        "--nd-rates", type=float, nargs="*", default=ND_RATES, help="ZFP rates in 2-D/3-D blocks"
    )
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--ratio-n", type=int, default=1 << 20, help="values per synthetic ratio set")
    ap.add_argument(
        "--quick", action="store_true", help="1M values, 2 repeats, one round, a smaller GPT"
    )
    ap.add_argument("--out", help="JSON path (default bench/results/codecs[_quick].json)")
    ap.add_argument(
        "--no-memory-reuse",
        action="store_true",
        help="leave glibc's malloc as it is: each call's output is a fresh mapping, faulted in as "
        "it is written (by default jaxhc.host_memory reuses freed memory, as `jaxhc train` does)",
    )
    ap.add_argument("--one-thread-child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    reuse = not args.no_memory_reuse and host_memory.reuse_freed_memory()
    if args.quick:
        args.n, args.repeats, args.ratio_n, args.rounds = 1 << 20, 2, 1 << 16, 1
    if args.one_thread_child:
        records = throughput(
            args.n, args.repeats, args.rates, args.dtypes, with_zfpy=True, nd_rates=args.nd_rates
        )
        with open(args.one_thread_child, "w") as f:
            json.dump(records, f)
        return

    every, one = [], []
    for _ in range(args.rounds):  # the same machine state for one thread and all, round by round
        every.append(
            throughput(
                args.n,
                args.repeats,
                args.rates,
                args.dtypes,
                with_zfpy=False,
                nd_rates=args.nd_rates,
            )
        )
        one.append(one_thread(args))
    records = best_of_rounds(every)
    merge_one_thread(records, best_of_rounds(one))
    what = (
        f"{args.n} values, best of {args.repeats} x {args.rounds} rounds, GB/s of input, "
        f"{jax.devices()[0]}"
    )
    notes = [
        "1 thr: one CPU, JAXHC_THREADS=1 (zfpy too); all: every thread. zfpy has no bfloat16.",
        "ratio: raw / used bytes (MPC: achieved on this random walk).",
        "host memory: "
        + (
            "freed memory reused (jaxhc.host_memory), as in `jaxhc train`."
            if reuse
            else "glibc's default: each call's output faulted in afresh (--no-memory-reuse)."
        ),
    ]
    tables = {}
    for key, title in (("s", "codec throughput, wall clock"), ("cpu_s", "per CPU-second")):
        rows = throughput_rows(records, key)
        print_table(f"{title}: {what}", THROUGHPUT_COLUMNS, rows, notes)
        tables[key] = markdown_table(THROUGHPUT_COLUMNS, rows, notes)

    sums = decode_sum_records(args.n, args.repeats)
    title = (
        f"ZFP rate 8 decode-and-sum of P payloads, {args.n} values in all, best of {args.repeats}"
    )
    print_table(title, DECODE_SUM_COLUMNS, decode_sum_rows(sums))
    tables["decode_sum"] = markdown_table(DECODE_SUM_COLUMNS, decode_sum_rows(sums))

    ratios = mpc_ratios(ratio_sets(args.ratio_n, args.quick), args.dtypes)
    columns, rows = ratio_table(ratios)
    notes = [
        "ratio = raw bytes / bytes used, over all arrays of a data set; budget b fits when "
        "ratio >= 1/b."
    ]
    print_table("MPC compression ratio (lossless)", columns, rows, notes)
    tables["mpc_ratio"] = markdown_table(columns, rows, notes)

    acc = accuracy.run(args.quick, args.n, args.repeats, args.dtypes)
    tables["accuracy"] = acc["markdown"]

    out = args.out or f"bench/results/codecs{'_quick' if args.quick else ''}.json"
    write_json(
        out,
        {
            "n": args.n,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "ratio_n": args.ratio_n,
            "host_memory_reuse": reuse,
            "throughput_data": "random walk (cumsum of N(0,1)) in float32, then cast",
            "throughput": records,
            "decode_sum": sums,
            "mpc_ratio": ratios,
            "accuracy": {"records": acc["records"], "speed": acc["speed"]},
            "markdown": tables,
        },
    )


if __name__ == "__main__":
    main()
