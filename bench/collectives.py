"""Compressed collectives: time, raw and wire bytes per rank, and projected time on real links.

    .venv/bin/python bench/collectives.py            # XLA transport, P = 2, 4, 8, 64 KB..64 MB
    .venv/bin/python bench/collectives.py --quick    # 64 KB and 1 MB, P = 4
    make bench-mpi [QUICK=1]                         # MPI transport, 2 and 4 processes
    mpirun -np 4 .venv/bin/python bench/collectives.py --transport mpi [--quick]
    python -m bench.links bench ...                  # MPI across shaped links (bench/links)

Options narrow the sweep: --collectives psum,all_gather --codecs lax,zfp:8 --sizes-kb 64,1024
--parts 2,4 --repeats 5 --data smooth|noise; --link-rate 1gbit names the rate of the links the
ranks run over (bench/links shapes them) and adds the ring bound. The JSON goes to
bench/results/collectives_xla.json or collectives_mpi_np<P>.json (`_quick` before `.json` with
--quick), or to --out.

Each case is one collective (psum, all_gather, psum_scatter, ppermute as a ring shift, all_to_all)
over a mesh axis "x" of P ranks, with one codec, on a message of --sizes-kb per rank (float32
gradient-like data, a smooth signal plus small noise; `--data noise` for noise), run through
`jaxhc.Launcher` on one of two transports:

- `--transport xla`: one process, P simulated host devices (`shard_map`), P from --parts.
- `--transport xla` started as several processes (JAXHC_* variables, SLURM, or mpirun: see
  `jaxhc.launch.init_distributed`): one device per process, P = the number of processes, XLA's
  collectives across processes through jax.distributed (gloo on CPU); `python -m bench.links
  bench --transport xla` runs it across shaped links. Process 0 prints and writes the JSON.
- `--transport mpi`: one process per rank under mpirun (P = the number of processes); jaxhc's
  collectives move their payloads with mpi4jax. Rank 0 prints the table and writes the JSON.

Codec "lax" is the plain collective (`codec=None`): XLA's own, or on MPI jaxhc's reduce-scatter +
all-gather psum that adds in rank order (bitwise XLA:CPU's). "lax-allreduce" (MPI, psum only) is
the plain psum through MPI_Allreduce. "bf16-cast" casts to bfloat16, runs the plain collective and
casts back (what PyTorch DDP's fp16 compression hook does: the peer a codec has to beat). "mpc"
has no budget (its payload has room for the worst case), "mpc:0.8" sends 80% of raw and falls back
to raw when the data does not fit.

Columns (the same for both transports; per rank and per call):
- ms best / ms median: wall time of one call over --repeats calls after a warm-up. Under MPI every
  call starts after a barrier, and of the ranks' best (median) times the slowest counts.
- cpu ms: the process CPU time of one call (all threads; the least over the calls; under MPI the
  largest of the ranks'). It includes MPI's polling while a rank waits for the network.
- ring ms (with --link-rate): raw bytes x 8 / rate, the time a plain ring collective needs on
  links of that rate (psum 2(P-1)/P x bytes per rank).
- raw MiB: what a plain ring collective moves; wire MiB: what the transport really moved
  (`jaxhc.accounting`); raw/wire; fallbacks: calls that went raw (lossy codec on NaN/Inf, MPC
  over its budget).
- ms @G Gb/s: an alpha-beta projection of one call on a link of G Gbit/s,
  t = codec_s + messages * alpha + wire bytes * 8 / (G * 1e9). codec_s: the values this rank
  encodes and decodes, at the codec speed measured here on data of the same kind and size (one
  process alone; under MPI rank 0 measures while the others wait; an MPC payload over its budget
  is sent raw and costs no decode). messages: the ring algorithm's count (psum 2(P-1), ppermute 1,
  the others P-1). alpha = 5 us.

On this machine the ranks share memory and two cores, so "ms" is codec- and CPU-bound and says
little about a network; the projection is what a rank with this machine's codec speed would see on
a bandwidth-limited link. The JSON keeps every number (and CPU times) per case.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from _common import fmt, markdown_table, print_table, time_codec, timings, write_json
from jax.sharding import PartitionSpec as P
from links.rates import parse_rate, rate_label

import jaxhc
from jaxhc.codecs import parse

LINKS_GBIT = (1, 10, 100)
ALPHA = 5e-6  # seconds per message (typical RDMA/TCP latency order)
SIZES_KB = (64, 1024, 16384, 65536)
CODECS = ("lax", "lax-allreduce", "bf16-cast", "none", "zfp:8", "zfp:16", "mpc", "mpc:0.8")
PLAIN = ("lax", "lax-allreduce", "bf16-cast")  # run the plain collective (codec=None)


def _ring(x, codec):
    p = jaxhc.axis_size("x")
    return jaxhc.ppermute(x, "x", [(i, (i + 1) % p) for i in range(p)], codec=codec)


# name -> (per-shard call, (n values per rank, P) -> (messages, values encoded, values decoded))
COLLECTIVES = {
    "psum": (
        lambda x, c: jaxhc.psum(x, "x", codec=c),
        lambda n, p: (2 * (p - 1), n + n / p, 2 * n),
    ),
    "all_gather": (
        lambda x, c: jaxhc.all_gather(x, "x", tiled=True, codec=c),
        lambda n, p: (p - 1, n, n * p),
    ),
    "psum_scatter": (
        lambda x, c: jaxhc.psum_scatter(x, "x", tiled=True, codec=c),
        lambda n, p: (p - 1, n, n),
    ),
    "ppermute": (_ring, lambda n, p: (1, n, n)),
    "all_to_all": (
        lambda x, c: jaxhc.all_to_all(x, "x", 0, 0, tiled=True, codec=c),
        lambda n, p: (p - 1, n, n),
    ),
}


def data(n: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return (rng.standard_normal(n) * 1e-3).astype(np.float32)
    t = np.linspace(0, 50, n)  # gradient-like: a smooth signal plus small noise
    return (np.sin(t) * 1e-2 + rng.standard_normal(n) * 1e-4).astype(np.float32)


@functools.cache
def codec_speed(spec: str, n: int, kind: str, repeats: int) -> tuple[float, float]:
    """(encode, decode) values per second of `spec` on n values (decode: inf when it never runs)."""
    if spec in PLAIN:
        return float("inf"), float("inf")
    t = time_codec(parse(spec), jnp.asarray(data(n, kind)), repeats)
    decode = n / t["decode"]["s"] if t["decode"] else float("inf")  # over budget: sent raw
    return n / t["encode"]["s"], decode


class Transport:
    """The launchers for P ranks on one transport; under MPI, the communicator and rank; under
    XLA started as several processes (jax.distributed), the process count and index."""

    def __init__(self, name: str):
        self.name, self.comm, self.rank, self.processes = name, None, 0, 1
        if name == "mpi":
            # Ranks waiting in MPI yield their core (read at MPI_Init, which importing MPI runs).
            os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
            from mpi4py import MPI

            self.comm, self.rank, self.max = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.MAX
        else:  # one process; or one of several (JAXHC_*, SLURM, mpirun): jax.distributed, gloo
            env = jaxhc.launch.init_distributed()
            self.processes, self.rank = env.num_processes, env.process_id
            self._barriers = 0

    @property
    def per_process(self) -> bool:
        """One rank per process (MPI, or XLA across processes) rather than P devices in one."""
        return self.comm is not None or self.processes > 1

    def barrier(self) -> None:
        """Every process waits for the others (jax.distributed's coordination service)."""
        from jax._src import distributed

        self._barriers += 1
        distributed.global_state.client.wait_at_barrier(f"bench{self._barriers}", 600_000)

    def gather(self, value: float) -> list[float]:
        """`value` of every process, in process order (a collective over the devices)."""
        from jax.experimental import multihost_utils

        return [float(v) for v in multihost_utils.process_allgather(np.float64(value))]

    def launchers(self, parts: int) -> dict:
        if self.comm is None:
            return {"lax": jaxhc.Launcher({"x": parts}, "xla")}
        return {
            "lax": jaxhc.Launcher({"x": parts}, "mpi", check_args=False),
            "lax-allreduce": jaxhc.Launcher(
                {"x": parts}, "mpi", psum="allreduce", check_args=False
            ),
        }

    def speed(self, *key) -> tuple[float, float]:
        if self.processes > 1:  # process 0's, as under MPI
            from jax.experimental import multihost_utils

            mine = np.asarray(codec_speed(*key) if self.rank == 0 else (0.0, 0.0), np.float64)
            return tuple(float(v) for v in multihost_utils.broadcast_one_to_all(mine))
        if self.comm is None:
            return codec_speed(*key)
        return self.comm.bcast(codec_speed(*key) if self.rank == 0 else None)

    def time(self, step, x, parts: int, repeats: int) -> tuple[dict, dict]:
        """Timings of `step(x)` (the slowest rank's under MPI) and the accounting per rank."""
        jax.block_until_ready(step(x))  # compile, outside the ledger
        with jaxhc.accounting.Ledger() as ledger:  # the second call is the warm-up
            jax.block_until_ready(step(x))
        zero = {"raw_bytes": 0.0, "wire_bytes": 0.0, "fallbacks": 0.0, "calls": 0.0}
        per = ledger.per_axis(devices=1 if self.per_process else parts).get("x", zero)
        if self.processes > 1:
            t = timings(lambda: step(x), repeats, warmup=0, before=self.barrier)
            out = {k: max(self.gather(v)) for k, v in t.items()}
            return {**out, "cpu_s_per_rank": self.gather(t["cpu_s"])}, per
        if self.comm is None:
            return timings(lambda: step(x), repeats, warmup=0), per
        t = timings(lambda: step(x), repeats, warmup=0, before=self.comm.Barrier)
        out = {k: self.comm.allreduce(v, op=self.max) for k, v in t.items()}
        return {**out, "cpu_s_per_rank": self.comm.allgather(t["cpu_s"])}, per


def _body(call, spec: str):
    if spec == "bf16-cast":
        return lambda v: call(v.astype(jnp.bfloat16), None).astype(v.dtype)
    return lambda v: call(v, None if spec in PLAIN else spec)


def run_case(tr: Transport, launcher, name: str, spec: str, x_global, parts, args) -> dict:
    call, model = COLLECTIVES[name]
    step = launcher.shard_map(_body(call, spec), in_specs=P("x"), out_specs=P("x"))
    t, per = tr.time(step, launcher.put(x_global, P("x")), parts, args.repeats)
    if spec == "bf16-cast":  # the ledger saw a bfloat16 collective; the message is float32
        per = {**per, "raw_bytes": per["raw_bytes"] * 2}
    n = x_global.size // parts
    messages, n_enc, n_dec = model(n, parts)
    enc_speed, dec_speed = tr.speed(spec, n, args.data, args.repeats)
    codec_s = n_enc / enc_speed + n_dec / dec_speed
    link = {g: codec_s + messages * ALPHA + per["wire_bytes"] * 8 / (g * 1e9) for g in LINKS_GBIT}
    bits = parse_rate(args.link_rate)
    return {
        "collective": name,
        "codec": spec,
        "transport": tr.name,
        "parts": parts,
        "bytes_per_rank": 4 * n,
        **t,
        **per,
        "messages": messages,
        "codec_seconds": codec_s,
        "projected_seconds": link,
        "link_rate": rate_label(args.link_rate),
        "ring_bound_s": per["raw_bytes"] * 8 / bits if bits else None,
    }


COLUMNS = [
    "collective",
    "P",
    "size/rank",
    "codec",
    "ms best",
    "ms median",
    "cpu ms",
    "raw MiB",
    "wire MiB",
    "raw/wire",
    "fallbacks",
    *(f"ms @{g} Gb/s" for g in LINKS_GBIT),
]


def size_label(nbytes: int) -> str:
    kib = nbytes / 1024
    return f"{kib:g} KiB" if kib < 1024 else f"{kib / 1024:g} MiB"


def row(r: dict, linked: bool = False) -> list[str]:
    raw, wire = r["raw_bytes"], r["wire_bytes"]
    ring = [fmt(r["ring_bound_s"] * 1e3 if r["ring_bound_s"] else None)] if linked else []
    return [
        r["collective"],
        r["parts"],
        size_label(r["bytes_per_rank"]),
        r["codec"],
        fmt(r["s"] * 1e3),
        fmt(r["median_s"] * 1e3),
        fmt(r["cpu_s"] * 1e3),
        fmt(raw / 2**20, "{:.3f}"),
        fmt(wire / 2**20, "{:.3f}"),
        fmt(raw / wire if wire else None),
        f"{r['fallbacks']:g}",
        *ring,
        *(fmt(r["projected_seconds"][g] * 1e3) for g in LINKS_GBIT),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--transport", choices=("xla", "mpi"), default="xla")
    ap.add_argument("--quick", action="store_true", help="64 KB and 1 MB, P = 4, 3 repeats")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--sizes-kb", default=",".join(map(str, SIZES_KB)))
    ap.add_argument("--parts", default="2,4,8", help="ranks per case (xla; mpi: mpirun -np)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", choices=["smooth", "noise"], default="smooth")
    ap.add_argument("--link-rate", help="rate of the links between the ranks: 1gbit, unshaped")
    ap.add_argument("--out", help="JSON path (default bench/results/collectives_<transport>...)")
    args = ap.parse_args(argv)
    try:
        parse_rate(args.link_rate)
    except ValueError as e:
        ap.error(str(e))
    if args.quick:
        args.sizes_kb, args.parts, args.repeats = "64,1024", "4", 3
    sizes = [int(s) for s in args.sizes_kb.split(",")]
    codecs = [c for c in args.codecs.split(",") if c != "lax-allreduce" or args.transport == "mpi"]
    tr = Transport(args.transport)
    if tr.comm:
        parts_list = [tr.comm.Get_size()]
    elif tr.processes > 1:
        parts_list = [tr.processes]  # one device per process
    else:
        parts_list = [int(p) for p in args.parts.split(",")]
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        jax.config.update("jax_num_cpu_devices", 1 if tr.per_process else max(parts_list))
    say = print if tr.rank == 0 else (lambda *a, **k: None)
    records = []
    for parts in parts_list:
        launchers = tr.launchers(parts)
        for kb in sizes:
            n = kb * 1024 // 4
            n -= n % (4 * parts)  # whole tiles for psum_scatter and all_to_all
            x_global = data(n * parts, args.data)
            for name in args.collectives.split(","):
                for spec in codecs:
                    if spec == "lax-allreduce" and name != "psum":
                        continue
                    launcher = launchers.get(spec, launchers["lax"])
                    records.append(run_case(tr, launcher, name, spec, x_global, parts, args))
                    line = row(records[-1], args.link_rate is not None)
                    say("  " + "  ".join(map(str, line)), file=sys.stderr, flush=True)

    if tr.rank == 0:
        records.sort(key=lambda r: (list(COLLECTIVES).index(r["collective"]), r["parts"]))
        linked = args.link_rate is not None
        rows = [row(r, linked) for r in records]
        columns = COLUMNS[:11] + ["ring ms"] * linked + COLUMNS[11:]
        what = "MPI, one process per rank" if tr.comm else "XLA, simulated host devices"
        if tr.processes > 1:
            what = "XLA, one process per rank (jax.distributed, gloo)"
        if linked:
            what += f", links {rate_label(args.link_rate)}"
        print_table(f"jaxhc collectives per rank and call ({what})", columns, rows)
        name = f"collectives_{args.transport}" + (f"_np{parts_list[0]}" if tr.per_process else "")
        out = args.out or f"bench/results/{name}{'_quick' if args.quick else ''}.json"
        write_json(
            out,
            {
                "transport": args.transport,
                "alpha_seconds": ALPHA,
                "links_gbit": LINKS_GBIT,
                "link_rate": rate_label(args.link_rate) if linked else None,
                "results": records,
                "markdown": markdown_table(columns, rows),
            },
        )


if __name__ == "__main__":
    main()
