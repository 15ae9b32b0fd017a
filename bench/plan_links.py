"""The planner's collective time against a measurement across shaped links (one MPI rank per host).

    .venv/bin/python -m bench.links run --hosts 4 --rate 1gbit -- \
        .venv/bin/python bench/plan_links.py --gbit 1 [--measure-links] --out PATH.json

Each rank is a host of `bench/links` (a network namespace whose egress is shaped to --gbit), so
every data group crosses nodes: the cluster is `hosts` nodes of one device, joined by --gbit links
(or, with --measure-links, links of the bandwidth raw all-gathers of other sizes reach across all
hosts at once) whose latency is measured here (a 1-byte MPI ping-pong between ranks 0 and 1),
and zfp:8's speeds are measured on every rank at once (the hosts share this machine's cores, as
the fused collectives' codecs do). For each plan of `bench/plan_check.py`'s kind (data =
hosts), the data collectives of one train step run alone on the MPI transport (`--transport
mpi`'s fused native calls), raw and under zfp:8 on every data level: best and median of
--repeats, against the cost model's prediction for that transport (`Layout.transport`: the
fused calls pipeline codec and wire). Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")  # one per rank

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from plan_check import (  # noqa: E402
    MODEL,
    ZDATA,
    chain,
    data_comms,
    mesh_axes,
    plan_row,
    write_report,
)

import jaxhc  # noqa: E402
from jaxhc.plan import cluster as clusters  # noqa: E402
from jaxhc.plan import profile  # noqa: E402
from jaxhc.plan.layout import Layout, device_params  # noqa: E402
from jaxhc.plan.shapes import from_gpt  # noqa: E402

PLANS = {  # data = 4: (s_p, s_g, s_os), levels
    4: [
        ((1, 4, 4), (4,)),  # jaxhc's ZeRO (AMSP's ZeRO-2), flat
        ((1, 1, 1), (4,)),  # DDP
        ((1, 1, 4), (4,)),  # ZeRO-1
        ((1, 2, 2), (2, 4)),  # MiCS-like: groups of 2
        ((1, 1, 2), (2, 4)),
        ((2, 2, 4), (2, 4)),
    ],
    2: [((1, 2, 2), (2,)), ((1, 1, 1), (2,)), ((1, 1, 2), (2,))],
}


def latency_us(comm, repeats: int = 200) -> float:
    """Half the median round trip of a 1-byte message between ranks 0 and 1 (µs)."""
    buf = np.zeros(1, np.uint8)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.Get_rank() == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        elif comm.Get_rank() == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
        times.append(time.perf_counter() - t0)
    return comm.bcast(statistics.median(times) / 2 * 1e6, root=0)


def measure(comms, lay: Layout, policy, repeats: int, comm):
    """Seconds (best, median over ranks' slowest) and this job's wire bytes per rank."""
    names = mesh_axes(lay)
    launcher = jaxhc.Launcher(
        {**dict(zip(names, lay.factors[::-1], strict=True)), "tensor": 1}, "mpi"
    )
    _, padded = device_params(from_gpt("m", MODEL), lay)
    spec = P((*names, "tensor"))
    step = launcher.shard_map(chain(comms, policy), in_specs=spec, out_specs=spec)
    x = jnp.asarray(profile.walk(padded, seed=1 + comm.Get_rank()))[None]
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        jax.block_until_ready(step(x))
    wire = sum(v["wire_bytes"] for v in ledger.per_axis(devices=1).values())
    times = slowest_runs(comm, lambda: step(x), repeats)
    return min(times), statistics.median(times), comm.allreduce(wire) / comm.Get_size()


def slowest_runs(comm, fn, repeats: int) -> list[float]:
    """Seconds of `repeats` runs of `fn()` started together on every rank, each the slowest
    rank's."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(comm.allreduce(time.perf_counter() - t0, op=_mpi().MAX))
    return times


# Calibration sizes (float32 values per rank's chunk): 0.5 and 6 MiB, none of the plans' messages.
LINK_VALUES = (2**17, 3 * 2**19)


def link_gbit(comm, repeats: int) -> float:
    """The links' bandwidth as the collectives see it: raw all-gathers over every host of
    `LINK_VALUES` values a rank (through the MPI transport, as the plans run), the best run (the
    slowest rank's) of each, fitted to t = (k - 1) (latency + chunk bytes / bandwidth) from the
    two sizes (the latency cancels; Gbit/s)."""
    k = comm.Get_size()
    launcher = jaxhc.Launcher({"data": k, "tensor": 1}, "mpi")
    spec = P(("data", "tensor"))
    step = launcher.shard_map(
        lambda v: jaxhc.all_gather(v, "data", tiled=True, kind="grad"),
        in_specs=spec,
        out_specs=spec,
    )
    seconds = []
    for values in LINK_VALUES:
        x = jnp.zeros((1, values), jnp.float32)
        jax.block_until_ready(step(x))
        seconds.append(min(slowest_runs(comm, lambda: step(x), repeats)))  # noqa: B023
    per_step = (seconds[1] - seconds[0]) / (k - 1)  # of (LINK_VALUES[1] - [0]) * 4 bytes more
    return (LINK_VALUES[1] - LINK_VALUES[0]) * 4 * 8 / per_step / 1e9


def _mpi():
    from mpi4py import MPI

    return MPI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gbit", type=float, required=True, help="the links' rate (Gbit/s)")
    ap.add_argument(
        "--measure-links",
        action="store_true",
        help="model the links at the bandwidth raw all-gathers of other sizes reach (link_gbit) "
        "instead of --gbit",
    )
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="bench/results/plan_links.json")
    args = ap.parse_args(argv)
    comm = _mpi().COMM_WORLD
    hosts = comm.Get_size()
    if hosts not in PLANS:
        raise SystemExit(f"plan_links: run with {' or '.join(map(str, PLANS))} ranks, not {hosts}")
    lat = latency_us(comm)
    speeds = profile.codec_speeds(["zfp:8"], mib=4, repeats=args.repeats)["zfp:8"]
    speeds = {k: comm.allreduce(speeds[k]) / hosts for k in ("encode_gb_s", "decode_gb_s")}
    gbit = link_gbit(comm, args.repeats) if args.measure_links else args.gbit
    link = {"gbit_s": gbit, "latency_us": lat}
    cluster = clusters.from_dict(
        {
            "name": f"{hosts} namespace hosts, {args.gbit:g} Gbit/s",
            "nodes": hosts,
            "devices_per_node": 1,
            "memory_gib": 1,
            "links": {"intra": link, "inter": link},
            "codecs": {"zfp:8": speeds},
        }
    )
    shape = from_gpt("gpt-3m", MODEL)
    rows = []
    for sizes, levels in PLANS[hosts]:
        for policy in (None, ZDATA):
            lay = Layout(hosts, 1, 1, 1, *sizes, levels, transport="mpi")
            comms, predicted = data_comms(shape, lay, cluster, policy)
            best, median, wire = measure(comms, lay, policy, args.repeats, comm)
            if comm.Get_rank() == 0:
                rows.append(plan_row(lay, policy, comms, predicted, best, median, wire, "median"))
    if comm.Get_rank() == 0:
        how = (
            f"bandwidth from raw all-gathers of {LINK_VALUES} values a rank (--measure-links)"
            if args.measure_links
            else f"bandwidth: the shaping rate --gbit {args.gbit:g}"
        )
        calibration = {"link": link, "link_bandwidth": how, "zfp:8": speeds}
        write_report(args.out, shape, calibration, cluster, rows, "median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
