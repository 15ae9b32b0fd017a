"""Codec throughput: jaxhc ZFP and MPC (FFI, inside jit) side by side with zfpy and a memcpy.

Throughput is GB/s of uncompressed input (1e9 bytes/s of the array as given: a bfloat16 array
counts 2 bytes per value). Each time is the best of --repeats runs after one warm-up run; the JSON
also keeps the median. zfpy runs single-threaded on float32 only (it has no bfloat16).

    python bench/codecs.py --out bench/results/codecs.json [--n 16777216] [--repeats 7]
        [--rates 4 8 16 24] [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import zfpy

from jaxhc.codecs import Mpc, Zfp

ZFP_RATES = (4, 8, 16, 24)
DTYPES = ("float32", "bfloat16")


def timings(fn, repeats: int) -> dict:
    """Seconds of fn() (which returns what to wait for) after one warm-up call: the best and the
    median wall time, and the least CPU time of the process (all threads: robust to other load)."""
    jax.block_until_ready(fn())
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"s": min(wall), "median_s": statistics.median(wall), "cpu_s": min(cpu)}


def data(n: int) -> np.ndarray:
    """A random walk: smooth at the scale of a ZFP block, like many activations and weights."""
    rng = np.random.default_rng(0)
    return np.cumsum(rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def bench_jaxhc(codec, x: jax.Array, repeats: int) -> dict:
    n, dtype = x.size, x.dtype
    encode = jax.jit(lambda v: codec.encode(v).payload)
    decode = jax.jit(lambda p: codec.decode(p, (n,), dtype))
    try:
        payload = jax.block_until_ready(encode(x))
    except Exception as e:  # noqa: BLE001 - a codec not built yet (the MPC branch) reports n/a
        return {"error": str(e).strip().splitlines()[-1][:100]}
    return {
        "encode": timings(lambda: encode(x), repeats),
        "decode": timings(lambda: decode(payload), repeats),
        "ratio": x.nbytes / payload.nbytes,
    }


def bench_zfpy(x: np.ndarray, rate: float, repeats: int) -> dict:
    stream = zfpy.compress_numpy(x, rate=rate, write_header=False)
    ztype, shape = zfpy.dtype_to_ztype(x.dtype), list(x.shape)
    return {
        "encode": timings(lambda: zfpy.compress_numpy(x, rate=rate, write_header=False), repeats),
        "decode": timings(lambda: zfpy._decompress(stream, ztype, shape, rate=rate), repeats),
        "ratio": x.nbytes / len(stream),
    }


def bench_memcpy(x: np.ndarray, repeats: int) -> dict:
    dst = np.empty_like(x)
    t = timings(lambda: np.copyto(dst, x), repeats)
    return {"encode": t, "decode": t}


def gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds / 1e9 if seconds > 0 else None


def run(n: int, repeats: int, rates, dtypes) -> list[dict]:
    base = data(n)
    rows = []
    for dtype in dtypes:
        x_np = base.astype(jnp.dtype(dtype))
        x = jax.device_put(x_np)
        nbytes = x_np.nbytes
        for codec in [*(Zfp(rate=r) for r in rates), Mpc()]:
            ours = bench_jaxhc(codec, x, repeats)
            row = {"codec": codec.spec, "dtype": dtype, "bytes": nbytes, "jaxhc": ours}
            if isinstance(codec, Zfp):
                row["zfpy"] = bench_zfpy(x_np, codec.rate, repeats) if dtype == "float32" else None
            rows.append(row)
            print(f"  done {codec.spec} {dtype}", file=sys.stderr, flush=True)
        rows.append(
            {
                "codec": "memcpy",
                "dtype": dtype,
                "bytes": nbytes,
                "numpy": bench_memcpy(x_np, repeats),
            }
        )
    return rows


def table_rows(rows: list[dict], key: str) -> list[list[str]]:
    """One line per row: GB/s from the `key` seconds ("s": wall, "cpu_s": CPU) and ours/zfpy."""

    def num(v, fmt="{:.3f}"):
        return "n/a" if v is None else fmt.format(v)

    out = []
    for r in rows:
        ours, z = r.get("jaxhc") or r["numpy"], r.get("zfpy")
        if "error" in ours:
            out.append([r["codec"], r["dtype"], "n/a", "n/a", "", "", "", "", ours["error"]])
            continue
        enc, dec = (gbps(r["bytes"], ours[op][key]) for op in ("encode", "decode"))
        zenc, zdec = (gbps(r["bytes"], z[op][key]) if z else None for op in ("encode", "decode"))
        note = num(ours["ratio"], "{:.1f}") if "ratio" in ours else ""
        if "zfpy" in r and z is None:
            note += "  (zfpy has no bfloat16)"
        vs_enc, vs_dec = (o / zz if zz else None for o, zz in ((enc, zenc), (dec, zdec)))
        out.append([r["codec"], r["dtype"], num(enc), num(dec), num(zenc), num(zdec),
                    num(vs_enc, "{:.2f}x"), num(vs_dec, "{:.2f}x"), note])  # fmt: skip
    return out


HEADER = ["codec", "dtype", "enc GB/s", "dec GB/s", "zfpy enc", "zfpy dec", "enc/zfpy", "dec/zfpy",
          "ratio"]  # fmt: skip


def print_table(rows: list[dict], title: str, key: str) -> None:
    body = table_rows(rows, key)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(HEADER)]
        print(title)
        for line in [HEADER, *body]:
            print(
                "  ".join(
                    c.rjust(w) if i > 1 else c.ljust(w)
                    for i, (c, w) in enumerate(zip(line, widths, strict=True))
                )
            )
        return
    t = Table(title=title)
    for c in HEADER:
        t.add_column(c, justify="left" if c in ("codec", "dtype") else "right")
    for b in body:
        t.add_row(*b)
    Console().print(t)


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "zfpy": getattr(zfpy, "__version__", "?"),
        "device": str(jax.devices()[0]),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24, help="values per array (default 16M)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (best kept)")
    ap.add_argument("--rates", type=float, nargs="+", default=ZFP_RATES, help="ZFP rates")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    rows = run(args.n, args.repeats, args.rates, args.dtypes)
    what = f"n={args.n}, best of {args.repeats}, GB/s of input, {jax.devices()[0]}"
    print_table(rows, f"codec throughput (wall clock), {what}", "s")
    print_table(rows, f"per CPU-second (process CPU time, all threads), {what}", "cpu_s")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        result = {
            "command": " ".join([sys.executable, *sys.argv]),
            "machine": machine(),
            "n": args.n,
            "repeats": args.repeats,
            "data": "random walk (cumsum of N(0,1)) in float32, then cast",
            "results": rows,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
