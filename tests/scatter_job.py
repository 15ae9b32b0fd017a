"""A jax.distributed process of tests/test_distributed.py's psum_scatter check (one CPU device):

    JAXHC_PROCESS_ID=r JAXHC_NUM_PROCESSES=2 JAXHC_COORDINATOR=... python tests/scatter_job.py N

N plain psum_scatters of 32 MiB pieces through jaxhc (the XLA transport) and through jax.lax;
prints how many of each came out different from the rank-order sum, e.g. "jaxhc 0/N lax 3/N".
"""

from __future__ import annotations

import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

PIECE = 1 << 23  # float32 values per rank and piece: 32 MiB


def main(repeats: int) -> None:
    import jaxhc

    jax.config.update("jax_num_cpu_devices", 1)
    env = jaxhc.launch.init_distributed()
    p = env.num_processes
    launcher = jaxhc.Launcher({"x": p}, "xla")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((p, p * PIECE)).astype(np.float32)
    want = x[0].copy()
    for r in range(1, p):
        want += x[r]  # rank order, in float32
    steps = {
        "jaxhc": launcher.shard_map(
            lambda a: jaxhc.psum_scatter(a[0], "x", tiled=True)[None], in_specs=P("x"),
            out_specs=P("x"),
        ),
        "lax": launcher.shard_map(
            lambda a: jax.lax.psum_scatter(a[0], "x", tiled=True)[None], in_specs=P("x"),
            out_specs=P("x"),
        ),
    }  # fmt: skip
    wrong = {k: 0 for k in steps}
    xs = launcher.put(x, P("x"))
    for _ in range(repeats):
        for k, step in steps.items():
            got = launcher.fetch(step(xs), P("x")).reshape(-1)
            wrong[k] += int(got.tobytes() != want.tobytes())
    print(" ".join(f"{k} {n}/{repeats}" for k, n in wrong.items()), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
