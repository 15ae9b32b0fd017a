"""Codec accuracy on jaxhc's GPT tensors: bits per value, relative L2 and max error of every lossy
codec, with the one-thread encode/decode speed of the block quantizers (plain and rotated) and of
3-D ZFP beside them.

    .venv/bin/python bench/accuracy.py --quick     # seconds: bench/results/accuracy_quick.json
    .venv/bin/python bench/accuracy.py             # the full sets and 16M values for the speed
    .venv/bin/python bench/accuracy.py --speed-only --out bench/results/quant_speed.json
    .venv/bin/python bench/accuracy.py --accuracy-only   # new accuracy rows, the speed rows kept

`make bench` runs it as part of bench/codecs.py (the "accuracy" table of codecs.json).

Data: `_sets.gpt_sets` (weights at init, gradients of one corpus batch, residual stream per block),
each set in float32 and in bfloat16. Every array goes through the codec (or the cast) on its own,
as a collective would send it. Beside them, the 4-bit codecs on i.i.d. references
(`_sets.reference_sets`: Gaussian, Laplace, Student's t4; float32): the rotated codecs' error is
that of the Lloyd-Max levels whatever the tails, plain q4's grows with them, so the ratio of the
two says how heavy-tailed a set's blocks are. And the gradients of a transformers GPT-2
(`_sets.hf_gpt2_gradients`: GPT-2's vocabulary and tied head, 4 layers of width 256, float32; full
run only) under q4 and q4:h at every block size from 64 to 1024. bits/value = payload bits over
values of the whole set (ZFP: its rate, block padding included; q8/q4: codes + float32 scales +
8-byte padding; casts: the type's width). rel L2 = ||x - decoded|| / ||x|| over the set, max err =
max |x - decoded|, max/absmax = max err / max |x| (float64 arithmetic on the values as given).
Speed: q8/q4, q8:h/q4:h, q4:b1024:h and zfp:8:d3 encode and decode of --n values (a random walk) in
a child pinned to one CPU with JAXHC_THREADS=1, GB/s of input (best of --repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from _common import fmt, gbps, markdown_table, print_table, time_codec, write_json
from _sets import gpt_sets, hf_gpt2_gradients, reference_sets

from jaxhc.codecs import Codec, parse

__all__ = ["CODECS", "Q4_BLOCKS", "Q4_CODECS", "accuracy", "one_thread_speed", "run", "speed"]

CODECS = (
    "zfp:4",
    "zfp:8",
    "zfp:16",
    "zfp:4:d3",
    "zfp:8:d2",
    "zfp:8:d3",
    "zfp:16:d3",
    "q8",
    "q4",
    "q8:b64",
    "q8:h",
    "q4:b64",
    "q4:b64:h",
    "q4:h",
    "q4:b1024",
    "q4:b1024:h",
    "bf16 cast",
    "fp16 cast",
)
Q4_CODECS = ("q4:b64", "q4:b64:h", "q4", "q4:h", "q4:b1024", "q4:b1024:h")
# Every rotated block size beside plain q4 at the same size (the transformers GPT-2's gradients).
Q4_BLOCKS = ("q4:b64", "q4:b64:h", "q4:b128", "q4:b128:h", "q4", "q4:h", "q4:b512", "q4:b512:h")
Q4_BLOCKS += ("q4:b1024", "q4:b1024:h")
DTYPES = ("float32", "bfloat16")
SPEED_CODECS = ("q8", "q4", "q8:h", "q4:h", "q4:b1024:h", "zfp:8:d3")
CASTS = {"bf16 cast": jnp.bfloat16, "fp16 cast": jnp.float16}


def _round_trip(codec: Codec | str, x: jax.Array) -> tuple[np.ndarray, int]:
    """(decoded values as float64, payload bits) of one array."""
    if isinstance(codec, str):  # a cast
        cast = CASTS[codec]
        y = x.astype(cast).astype(x.dtype)
        return np.asarray(y, np.float64), x.size * 8 * jnp.dtype(cast).itemsize
    fn = jax.jit(lambda a: codec.decode(codec.encode(a).payload, a.shape, a.dtype))
    return np.asarray(fn(x), np.float64), 8 * codec.payload_bytes(x.size, x.dtype)


def accuracy(sets: dict[str, list[np.ndarray]], dtypes=DTYPES, codecs=CODECS) -> list[dict]:
    records = []
    for name, arrays in sets.items():
        for dtype in dtypes:
            xs = [jnp.asarray(a, dtype) for a in arrays]
            ref = np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in xs])
            norm, amax = float(np.linalg.norm(ref)), float(np.abs(ref).max())
            for spec in codecs:
                codec = spec if spec in CASTS else parse(spec)
                outs = [_round_trip(codec, x) for x in xs]
                err = ref - np.concatenate([y.reshape(-1) for y, _ in outs])
                finite = bool(np.isfinite(err).all())
                max_err = float(np.abs(err).max()) if finite else float("inf")
                records.append(
                    {
                        "data": name,
                        "dtype": dtype,
                        "codec": spec,
                        "values": int(ref.size),
                        "bits_per_value": sum(b for _, b in outs) / ref.size,
                        "rel_l2": float(np.linalg.norm(err)) / norm if finite else float("inf"),
                        "max_err": max_err,
                        "max_err_over_absmax": max_err / amax,
                    }
                )
    return records


def speed(n: int, repeats: int, dtypes=DTYPES) -> list[dict]:
    """SPEED_CODECS encode/decode timings in this process (the child of `one_thread_speed`)."""
    walk = np.cumsum(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    records = []
    for dtype in dtypes:
        x = jax.device_put(walk.astype(jnp.dtype(dtype)))
        for spec in SPEED_CODECS:
            t = time_codec(parse(spec), x, repeats)
            records.append({"codec": spec, "dtype": dtype, "bytes": x.nbytes, "one_thread": t})
    return records


def one_thread_speed(n: int, repeats: int, dtypes=DTYPES) -> list[dict]:
    """`speed` in a child process pinned to one CPU (taskset) with JAXHC_THREADS=1."""
    cpu = min(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "speed.json")
        cmd = ["taskset", "-c", str(cpu), sys.executable, os.path.abspath(__file__)]
        cmd += ["--speed-child", out, "--n", str(n), "--repeats", str(repeats)]
        cmd += ["--dtypes", *dtypes]
        subprocess.run(cmd, env={**os.environ, "JAXHC_THREADS": "1"}, check=True)
        with open(out) as f:
            return json.load(f)


COLUMNS = [
    "data",
    "dtype",
    "codec",
    "bits/value",
    "rel L2",
    "max err",
    "max/absmax",
    "enc GB/s 1 thr",
    "dec GB/s 1 thr",
]


def table(records: list[dict], speeds: list[dict]) -> list[list[str]]:
    by_key = {(s["codec"], s["dtype"]): s for s in speeds}
    rows = []
    for r in records:
        s = by_key.get((r["codec"], r["dtype"]))
        gb = [
            fmt(gbps(s["bytes"], s["one_thread"][op]["s"]), "{:.2f}") if s else ""
            for op in ("encode", "decode")
        ]
        rows.append(
            [
                r["data"],
                r["dtype"],
                r["codec"],
                f"{r['bits_per_value']:.3f}",
                f"{r['rel_l2']:.2e}",
                f"{r['max_err']:.2e}",
                f"{r['max_err_over_absmax']:.2e}",
                *gb,
            ]
        )
    return rows


NOTES = [
    "Each array coded on its own; errors over the whole set, in float64, against the values as "
    "given (bfloat16 rows: against the bfloat16 values). q8 = int8 codes + a float32 absmax "
    "scale per 256 values; q8:b64 per 64. zfp:R:d2 / zfp:R:d3: ZFP's 2-D / 3-D blocks of 16 / "
    "64 consecutive values (the array laid out as (n/4, 4) / (n/16, 4, 4)). q8:h / q4:h: each "
    "block of 256 values turned by a fixed randomized Hadamard transform, then coded with the "
    "256 / 16 Lloyd-Max levels of a Gaussian scaled by the block's RMS (the last block of each "
    "array padded to 256 codes); q4:b64 / q4:b1024 (:h): blocks of 64 / 1024. gaussian, "
    "laplace, student t4: 2^20 i.i.d. values of each (float32), 4-bit codecs only. gpt-2 "
    "gradients: a transformers FlaxGPT2LMHeadModel (vocabulary 50257, 4 layers of width 256, "
    "random init) on 16 x 128 corpus tokens, q4 and q4:h at blocks of 64 to 1024.",
    "GB/s: 1e9 bytes of input per second, one CPU, JAXHC_THREADS=1, random walk data.",
]


def run(quick: bool, n: int, repeats: int, dtypes=DTYPES, speeds=None) -> dict:
    """The accuracy records, the speed records and the table (printed and as markdown);
    `speeds`: speed records to show instead of measuring them."""
    records = accuracy(gpt_sets(quick), dtypes)
    records += accuracy(reference_sets(), ("float32",), Q4_CODECS)
    if not quick:
        records += accuracy(hf_gpt2_gradients(), ("float32",), Q4_BLOCKS)
    if speeds is None:
        speeds = one_thread_speed(n, repeats, dtypes)
    rows = table(records, speeds)
    title = "codec accuracy on jaxhc's GPT tensors (q8/q4, q8:h/q4:h, zfp:8:d3 speed: one thread)"
    print_table(title, COLUMNS, rows, NOTES)
    return {"records": records, "speed": speeds, "markdown": markdown_table(COLUMNS, rows, NOTES)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1 << 24, help="values for the speed runs")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--quick", action="store_true", help="a smaller GPT, 1M values, 2 repeats")
    ap.add_argument("--speed-only", action="store_true", help="the one-thread speed rows alone")
    ap.add_argument(
        "--accuracy-only",
        action="store_true",
        help="the accuracy rows anew, the speed rows (and n, repeats) kept from --out's file",
    )
    ap.add_argument("--out", help="JSON path (default bench/results/accuracy[_quick].json)")
    ap.add_argument("--speed-child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 1 << 20, 2
    if args.speed_child:
        with open(args.speed_child, "w") as f:
            json.dump(speed(args.n, args.repeats, args.dtypes), f)
        return
    if args.speed_only:
        speeds = one_thread_speed(args.n, args.repeats, args.dtypes)
        for s in speeds:
            enc, dec = (gbps(s["bytes"], s["one_thread"][op]["s"]) for op in ("encode", "decode"))
            print(f"{s['codec']:10s} {s['dtype']:9s} encode {enc:.2f} GB/s, decode {dec:.2f}")
        out = args.out or "bench/results/quant_speed.json"
        write_json(out, {"n": args.n, "repeats": args.repeats, "speed": speeds})
        return
    out = args.out or f"bench/results/accuracy{'_quick' if args.quick else ''}.json"
    speeds = None
    if args.accuracy_only:
        if not os.path.exists(out):
            raise SystemExit(f"--accuracy-only: {out} does not exist (its speed rows are kept)")
        with open(out) as f:
            kept = json.load(f)
        speeds, args.n, args.repeats = kept["speed"], kept["n"], kept["repeats"]
    result = run(args.quick, args.n, args.repeats, args.dtypes, speeds)
    if args.accuracy_only:  # where the kept speed rows were measured
        result["speed_measured_by"] = kept.get("speed_measured_by") or {
            k: kept.get(k) for k in ("command", "machine")
        }
    write_json(out, {"n": args.n, "repeats": args.repeats, "quick": args.quick, **result})


if __name__ == "__main__":
    main()
