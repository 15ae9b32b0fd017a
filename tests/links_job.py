"""The job that tests/test_links.py runs across a 2-host shaped-link cluster (one rank per host):

    mpirun ... python tests/links_job.py OUT.npz
    python -m bench.links run --distributed ... -- python tests/links_job.py OUT.npz xla

A 1 MiB-per-rank psum, plain and zfp:8, over the MPI transport (or the XLA transport across two
jax.distributed processes); rank 0 saves the global results.
"""

from __future__ import annotations

import sys

import numpy as np
from jax.sharding import PartitionSpec as P

CODECS = (None, "zfp:8")
N = 1 << 18  # float32 values per rank: 1 MiB


def data() -> np.ndarray:
    rng = np.random.default_rng(9)
    t = np.linspace(0, 20, 2 * N).reshape(2, N)
    return (np.sin(t) + 0.01 * rng.standard_normal((2, N))).astype(np.float32)


def steps(launcher):
    import jaxhc

    return {
        str(codec): launcher.shard_map(
            lambda x, codec=codec: jaxhc.psum(x, "x", codec=codec), in_specs=P("x"), out_specs=P()
        )
        for codec in CODECS
    }


def main(out: str, transport: str = "mpi") -> None:
    import jax

    import jaxhc

    rank = 0
    if transport == "xla":  # one process per host: jax.distributed from the JAXHC_* variables
        jax.config.update("jax_num_cpu_devices", 1)
        rank = jaxhc.launch.init_distributed().process_id
    launcher = jaxhc.Launcher({"x": 2}, transport)
    x = launcher.put(data(), P("x"))
    got = {k: launcher.fetch(step(x), P()) for k, step in steps(launcher).items()}
    if (launcher.grid.rank if launcher.grid else rank) == 0:
        np.savez(out, **got)


if __name__ == "__main__":
    main(*sys.argv[1:])
