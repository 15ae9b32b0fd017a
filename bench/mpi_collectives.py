"""jaxhc's collectives on the MPI transport: one process per device under mpirun.

    mpirun -np 4 --oversubscribe python bench/mpi_collectives.py --quick
    mpirun -np 2 python bench/mpi_collectives.py --out bench/results/mpi_collectives_np2.json

Every rank holds `size` bytes of float32 (gradient-like data) and runs the collective over the one
mesh axis "x" of P = (number of processes) ranks. The time is the slowest rank's median over
`--repeats` calls after a warm-up, each call started together (barrier); the bytes are rank 0's
accounting (raw: what a plain ring collective moves per rank; wire: what the transport moved).
Codec "lax" is the plain collective: psum as reduce-scatter + all-gather that adds in rank order
(bitwise XLA:CPU's all-reduce); "lax-allreduce" is the plain psum through MPI_Allreduce (Open MPI's
order). Codecs whose kernels are not built yet are reported as unavailable. Rank 0 prints the table
and writes the JSON; `run` is the function to call from other scripts (under mpirun).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import markdown_table, print_table, write_json  # noqa: E402

import jaxhc  # noqa: E402

SIZES_KB = (64, 1024, 16384, 65536)
QUICK_SIZES_KB = (64, 1024)
CODECS = ("lax", "lax-allreduce", "none", "zfp:8", "mpc")


def _call(name, x, codec):
    if name == "psum":
        return jaxhc.psum(x, "x", codec=codec)
    if name == "all_gather":
        return jaxhc.all_gather(x, "x", tiled=True, codec=codec)
    if name == "psum_scatter":
        return jaxhc.psum_scatter(x, "x", tiled=True, codec=codec)
    if name == "all_to_all":
        return jaxhc.all_to_all(x, "x", 0, 0, tiled=True, codec=codec)
    if name == "ppermute":
        parts = jaxhc.axis_size("x")
        return jaxhc.ppermute(x, "x", [(i, (i + 1) % parts) for i in range(parts)], codec=codec)
    raise ValueError(f"unknown collective {name!r}")


def _data(n, rank):
    t = np.linspace(0, 50, n) + rank
    rng = np.random.default_rng(rank)
    return (np.sin(t) * 1e-2 + rng.standard_normal(n) * 1e-4).astype(np.float32)


def _unavailable(spec) -> str | None:
    if spec.startswith("lax"):
        return None
    try:
        jaxhc.codecs.parse(spec).encode(jnp.ones(64, jnp.float32)).payload.block_until_ready()
    except Exception as e:  # stub kernels until the codecs land
        return str(e).splitlines()[0][:60]
    return None


def run(collectives=("psum", "all_gather"), codecs=CODECS, sizes_kb=SIZES_KB, repeats=5):
    """Time each case on the MPI transport; every rank returns the same list of records."""
    launchers = {
        mode: jaxhc.Launcher({"x": _world_size()}, "mpi", psum=mode)
        for mode in ("exact", "allreduce")
    }
    comm = launchers["exact"].grid.control
    parts, rank = comm.Get_size(), comm.Get_rank()
    missing = {s: _unavailable(s) for s in codecs}
    records = []
    for name in collectives:
        for spec in codecs:
            if spec == "lax-allreduce" and name != "psum":
                continue
            for kb in sizes_kb:
                n = kb * 1024 // 4
                n -= n % (4 * parts)
                rec = {"collective": name, "codec": spec, "parts": parts, "bytes_per_rank": 4 * n}
                if missing[spec]:
                    records.append({**rec, "unavailable": missing[spec]})
                    continue
                launcher = launchers["allreduce" if spec == "lax-allreduce" else "exact"]
                codec = None if spec.startswith("lax") else spec
                step = launcher.shard_map(
                    lambda v, name=name, codec=codec: _call(name, v, codec),
                    in_specs=P("x"),
                    out_specs=P("x"),
                )
                x = jnp.asarray(_data(n, rank))
                jax.block_until_ready(step(x))  # compile and warm up
                with jaxhc.accounting.Ledger() as ledger:
                    jax.block_until_ready(step(x))
                times = []
                for _ in range(repeats):
                    comm.Barrier()
                    t0 = time.perf_counter()
                    jax.block_until_ready(step(x))
                    times.append(time.perf_counter() - t0)
                seconds = comm.allreduce(statistics.median(times), op=_max())
                per = ledger.per_axis(devices=1).get("x", {})
                records.append({**rec, "seconds": seconds, **per})
                if rank == 0:
                    print(_row(records[-1]), flush=True)
    return records


def _world_size():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def _max():
    from mpi4py import MPI

    return MPI.MAX


COLUMNS = [
    "collective",
    "P",
    "MiB/rank",
    "codec",
    "ms",
    "GB/s/rank",
    "raw MiB",
    "wire MiB",
    "raw/wire",
]


def _row(r):
    head = [r["collective"], r["parts"], f"{r['bytes_per_rank'] / 2**20:.3f}", r["codec"]]
    if "unavailable" in r:
        return head + ["unavailable", "", "", "", ""]
    raw, wire = r.get("raw_bytes", 0.0), r.get("wire_bytes", 0.0)
    return head + [
        f"{r['seconds'] * 1e3:.2f}",
        f"{r['bytes_per_rank'] / r['seconds'] / 1e9:.3f}",
        f"{raw / 2**20:.3f}",
        f"{wire / 2**20:.3f}",
        f"{raw / wire:.2f}" if wire else "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--out", default=None, help="JSON path (default bench/results/mpi_collectives_np<P>.json)"
    )
    ap.add_argument("--quick", action="store_true", help="64 KB and 1 MB only, 3 repeats")
    ap.add_argument("--collectives", default="psum,all_gather")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--sizes-kb", default=",".join(map(str, SIZES_KB)))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = QUICK_SIZES_KB if args.quick else [int(s) for s in args.sizes_kb.split(",")]
    records = run(
        collectives=args.collectives.split(","),
        codecs=args.codecs.split(","),
        sizes_kb=sizes,
        repeats=3 if args.quick else args.repeats,
    )
    if _rank() == 0:
        rows = [_row(r) for r in records]
        parts = records[0]["parts"] if records else _world_size()
        print_table(f"jaxhc collectives on the MPI transport, {parts} processes", COLUMNS, rows)
        out = args.out or f"bench/results/mpi_collectives_np{parts}.json"
        write_json(
            out, {"transport": "mpi", "results": records, "markdown": markdown_table(COLUMNS, rows)}
        )


def _rank():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


if __name__ == "__main__":
    main()
