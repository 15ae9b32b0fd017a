"""The collective benchmark across shaped links.

For each P (hosts, one rank each) one cluster; for each link rate the live cluster's links are
reshaped, a TCP probe measures what one stream gets through them, and `bench/collectives.py
--transport mpi` runs under mpirun across the hosts. The runs are merged into one JSON (written
after every run, so a sweep cut short keeps what it measured), a markdown table and a PNG
(`report.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .cluster import COORDINATOR_PORT, PREFIX, Cluster
from .rates import parse_rate, rate_label

BENCH = Path(__file__).resolve().parents[1]
DEFAULTS = {
    "collectives": "psum,all_gather,psum_scatter",
    "codecs": "lax,bf16-cast,zfp:8,zfp:16,mpc:0.8",
    "sizes_mb": "4,16,64",
    "hosts": "2,4",
    "rates": "100mbit,1gbit,unshaped",
    "repeats": 5,
}
QUICK = {
    "collectives": "psum",
    "codecs": "lax,bf16-cast,zfp:8",
    "sizes_mb": "4",
    "hosts": "2",
    "rates": "100mbit,1gbit,unshaped",
    "repeats": 5,
}
PROBE_SECONDS = 1.0  # the TCP probe sends about this long at the link rate


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help=f"a few minutes: {_spell(QUICK)}")
    ap.add_argument("--collectives", help=f"default {DEFAULTS['collectives']}")
    ap.add_argument("--codecs", help=f"default {DEFAULTS['codecs']}")
    ap.add_argument("--sizes-mb", help=f"MiB per rank, default {DEFAULTS['sizes_mb']}")
    ap.add_argument("--hosts", help=f"P values (one rank per host), default {DEFAULTS['hosts']}")
    ap.add_argument("--rates", help=f"link rates, default {DEFAULTS['rates']}")
    ap.add_argument("--repeats", type=int, help=f"timed calls, default {DEFAULTS['repeats']}")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per mpirun (4 h)")
    ap.add_argument(
        "--transport", choices=("mpi", "xla"), default="mpi",
        help="mpi: mpirun across the hosts; xla: one process per host under jax.distributed",
    )  # fmt: skip
    ap.add_argument(
        "--out", help="JSON (.md, .png beside); default bench/results/links.json (links_xla.json)"
    )


def _spell(cfg: dict) -> str:
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in cfg.items())


def resolve(args: argparse.Namespace) -> dict:
    """The sweep's settings (--quick, then the options given); a bad value is a ValueError."""
    cfg = dict(QUICK if args.quick else DEFAULTS)
    for key in cfg:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    hosts = [_whole(h, "--hosts", 2) for h in str(cfg["hosts"]).split(",")]
    sizes = [_whole(s, "--sizes-mb", 1) for s in str(cfg["sizes_mb"]).split(",")]
    rates = [rate_label(r) for r in str(cfg["rates"]).split(",")]
    rates.sort(key=lambda r: parse_rate(r) or float("inf"))
    repeats = _whole(cfg["repeats"], "--repeats", 1)
    return {**cfg, "hosts": hosts, "sizes_mb": sizes, "rates": rates, "repeats": repeats}


def _whole(v, name: str, least: int) -> int:
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or n < least:
        raise ValueError(f"{name} {v!r}: expected a whole number >= {least}")
    return n


def run(args: argparse.Namespace) -> None:
    from . import report  # matplotlib, and jax through bench/_common

    cfg = resolve(args)
    if args.out is None:
        name = "links.json" if args.transport == "mpi" else "links_xla.json"
        args.out = f"bench/results/{name}"
    sweep = {**{k: cfg[k] for k in DEFAULTS}, "transport": args.transport}
    doc = {"sweep": sweep, "runs": [], "results": []}
    # Named as the cluster's files are, so that remove_leftovers() keeps it while this run lives.
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-sweep-") as tmp:
        for hosts in cfg["hosts"]:
            with Cluster(hosts) as cluster:
                for rate in cfg["rates"]:
                    doc = _one(cluster, rate, cfg, args, tmp, doc)
                    report.write(args.out, doc)


def _one(cluster: Cluster, rate: str, cfg: dict, args, tmp: str, doc: dict) -> dict:
    cluster.set_rate(rate)
    bits = parse_rate(rate)
    probe = int(min(512 << 20, max(16 << 20, (bits or 8e9) * PROBE_SECONDS / 8)))
    tcp = cluster.throughput(0, 1, probe)
    say(f"links: {cluster.hosts} hosts, {rate}: one TCP stream {tcp / 1e6:.0f} Mbit/s")
    out = os.path.join(tmp, f"np{cluster.hosts}_{rate}.json")
    command = [
        sys.executable,
        str(BENCH / "collectives.py"),
        f"--transport={args.transport}",
        f"--collectives={cfg['collectives']}",
        f"--codecs={cfg['codecs']}",
        f"--sizes-kb={','.join(str(s * 1024) for s in cfg['sizes_mb'])}",
        f"--repeats={cfg['repeats']}",
        f"--link-rate={rate}",
        f"--out={out}",
    ]
    if args.transport == "mpi":
        cluster.run(command, timeout=args.timeout)
        spelled = " ".join(cluster.mpirun_argv(command))
    else:
        one = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}  # a device per host
        cluster.run_distributed(command, timeout=args.timeout, env=one)
        spelled = distributed_command(cluster, command)
    with open(out) as f:
        got = json.load(f)
    for r in got["results"]:
        r["tcp_bits_per_s"] = tcp
    run = {
        "hosts": cluster.hosts,
        "link_rate": rate,
        "tcp_bits_per_s": tcp,
        "tcp_probe_bytes": probe,
        "command": spelled,
        "machine": got["machine"],
    }
    return {**doc, "runs": [*doc["runs"], run], "results": [*doc["results"], *got["results"]]}


def distributed_command(cluster: Cluster, command: list[str]) -> str:
    """How `Cluster.run_distributed` starts `command`, spelled out for the JSON."""
    return (
        f"in each host i = 0..{cluster.hosts - 1} (its own network namespace, address "
        f"10.77.0.<i+1>): JAXHC_PROCESS_ID=i JAXHC_NUM_PROCESSES={cluster.hosts} "
        f"JAXHC_COORDINATOR={cluster.addresses[0]}:{COORDINATOR_PORT} "
        f"JAXHC_GLOO_HOSTNAME=10.77.0.<i+1> {' '.join(command)}"
    )


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
