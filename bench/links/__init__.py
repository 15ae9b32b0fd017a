"""Shaped links on one machine: P network-namespace hosts on a bridge, MPI across them.

    sudo .venv/bin/python -m bench.links bench --quick     # the collective benchmark
    sudo .venv/bin/python -m bench.links run --hosts 2 --rate 1gbit -- .venv/bin/python job.py

Python: `with Cluster(hosts=2, rate="1gbit") as c: c.run([...])` (see `Cluster`).
"""

from .cluster import (
    PREFIX,
    Cluster,
    ClusterError,
    Interrupted,
    check_available,
    namespaces,
    remove_leftovers,
)
from .rates import parse_rate, rate_label

__all__ = [
    "PREFIX",
    "Cluster",
    "ClusterError",
    "Interrupted",
    "check_available",
    "namespaces",
    "parse_rate",
    "rate_label",
    "remove_leftovers",
]
