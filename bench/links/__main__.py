"""`python -m bench.links`: shaped-link clusters on this machine (root only).

    python -m bench.links bench [--quick] [--hosts 2,4] [--rates 100mbit,1gbit,unshaped] ...
    python -m bench.links bench --transport xla ...        # jax.distributed instead of mpirun
    python -m bench.links run --hosts 2 --rate 1gbit [--timeout S] -- COMMAND ...
    python -m bench.links run --distributed --hosts 2 -- COMMAND ...
    python -m bench.links train [--hosts 2,4] [--rate 1gbit] [--policies none,zhybrid] [...]
    python -m bench.links train --transport xla ...
    python -m bench.links train --policies none,zhybrid --peer none,fp16,bf16,powersgd ...
    python -m bench.links peer [--hosts 2,4] [--rate 1gbit,unshaped] [--hooks none,fp16] [...]
    python -m bench.links probe --hosts 2 --rates 100mbit,1gbit,unshaped
    python -m bench.links report bench/results/links.json
    python -m bench.links clean [--all]
    python -m bench.links check

`bench` runs bench/collectives.py --transport mpi across the hosts for each P and rate; `train`
runs `jaxhc train --transport mpi` across them per policy (bench/links/train.py), and with
`--peer` PyTorch DDP over gloo per communication hook after them, on the same cluster (the
`peer` extra); `peer` runs the DDP hooks alone (and jaxhc's policies too when `--policies` names
some); `run` runs any command under mpirun (one rank per host). With `--transport xla`
(`run --distributed`) there is no mpirun: one process per host forms a jax.distributed job
(coordinator on host 0's address, gloo on each host's own: the JAXHC_* variables of
`Cluster.distributed_env`); when one fails, the others get 60 s to end by themselves, and the
error names the host that failed first. `probe` measures one TCP stream from host 0 to host 1 at
each rate; `report` redoes a sweep's or a training run's markdown and PNG; `clean` deletes the
namespaces of runs that were killed (--all: of every run); `check` says whether clusters can be
made here.

A run ends with its cluster deleted, also on an error, Ctrl-C, SIGTERM or SIGHUP (SIGKILL cannot
be caught: the next run, or `clean`, deletes what it left). Without root, or where namespaces
cannot be made, it says so in one line and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys

from .cluster import Cluster, ClusterError, Interrupted, check_available, remove_leftovers
from .rates import parse_rate, rate_label


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.links",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    from . import sweep, train

    sweep.add_arguments(sub.add_parser("bench", help="the collective benchmark across the links"))
    train.add_arguments(sub.add_parser("train", help="jaxhc train per policy across the links"))
    train.add_arguments(
        sub.add_parser("peer", help="PyTorch DDP per hook across the links"), peer_only=True
    )
    r = sub.add_parser("run", help="run a command under mpirun across a cluster")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--rate", default="1gbit", help="100mbit, 1gbit, ... or unshaped")
    r.add_argument("--ranks-per-host", type=int, default=1)
    r.add_argument("--timeout", type=float, help="seconds (default: none)")
    r.add_argument(
        "--distributed", action="store_true",
        help="no mpirun: one process per host of a jax.distributed job (JAXHC_* variables)",
    )  # fmt: skip
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    p = sub.add_parser("probe", help="TCP throughput from host 0 to host 1 per rate")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rates", default="100mbit,1gbit,unshaped")
    p.add_argument("--bytes-mb", type=int, default=64)
    rep = sub.add_parser("report", help="redo the markdown and PNG of a links or training JSON")
    rep.add_argument("json")
    cmp = sub.add_parser("compare", help="markdown: median ms of the cells two links JSONs share")
    cmp.add_argument("before")
    cmp.add_argument("after", nargs="+", help="one or more later runs (the last wins a cell)")
    c = sub.add_parser("clean", help="delete namespaces left by killed runs")
    c.add_argument("--all", action="store_true", help="also those of runs still alive")
    sub.add_parser("check", help="can clusters be made here (root, namespaces, ip, tc)?")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "report":
            from . import report

            report.rewrite(args.json)
            return 0
        if args.cmd == "compare":
            from . import report

            print(report.compare(args.before, args.after))
            return 0
        if args.cmd == "bench":
            sweep.resolve(args)  # bad options fail before anything is made
        if args.cmd in ("train", "peer"):
            train.resolve(args)
        if args.cmd == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise ValueError("run: no command given (python -m bench.links run ... -- CMD)")
            parse_rate(args.rate)
        if args.cmd == "probe":
            rates = [rate_label(x) for x in args.rates.split(",")]
        check_available()
        if args.cmd == "check":
            print("bench-links: root, network namespaces, ip and tc are available")
        elif args.cmd == "clean":
            gone = remove_leftovers(all_runs=args.all)
            print(f"removed {len(gone)} namespaces" + (f": {' '.join(gone)}" if gone else ""))
        elif args.cmd == "bench":
            sweep.run(args)
        elif args.cmd in ("train", "peer"):
            train.run(args)
        elif args.cmd == "run":
            with Cluster(args.hosts, args.rate) as cluster:
                if args.distributed:
                    cluster.run_distributed(command, timeout=args.timeout)
                    return 0
                done = cluster.run(
                    command, ranks_per_host=args.ranks_per_host, timeout=args.timeout, check=False
                )
            return done.returncode
        elif args.cmd == "probe":
            with Cluster(args.hosts) as cluster:
                for rate in rates:
                    cluster.set_rate(rate)
                    bits = cluster.throughput(0, 1, args.bytes_mb << 20)
                    print(f"{rate}: {bits / 1e6:.0f} Mbit/s (one TCP stream, host 0 -> host 1)")
    except (ClusterError, ValueError) as e:
        print(f"bench-links: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        name, signum = (str(e), e.signum) if isinstance(e, Interrupted) else ("SIGINT", 2)
        print(f"bench-links: interrupted by {name}; its namespaces are deleted", file=sys.stderr)
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
