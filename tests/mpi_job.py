"""Small multi-process jobs that tests/test_mpi_launch.py starts as subprocesses.

mpirun -np 2 python tests/mpi_job.py raise      # rank 1 raises while rank 0 sits in a collective
mpirun -np 2 python tests/mpi_job.py mismatch   # ranks call one step with different shapes
mpirun -np 2 python tests/mpi_job.py ok         # a psum that works (prints the result)
mpirun -np 2 python tests/mpi_job.py die        # rank 1 is SIGKILLed while rank 0 keeps stepping
python tests/mpi_job.py distributed             # XLA transport after jax.distributed (JAXHC_*)
python tests/mpi_job.py distributed-die1        # as distributed; then process 1 is SIGKILLed
python tests/mpi_job.py distributed-die0        # ... process 0 (the coordinator's host)
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from jax.sharding import PartitionSpec as P


def body(x):
    import jaxhc

    return jaxhc.psum(x, "data", codec="none")


def mpi_job(mode: str) -> None:
    import jaxhc

    if mode == "badmesh":
        jaxhc.Launcher({"data": 4}, "mpi")
    launcher = jaxhc.Launcher({"data": 2}, "mpi")
    rank = launcher.grid.rank
    step = launcher.shard_map(body, in_specs=P("data"), out_specs=P())
    x = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    if mode == "raise":
        if rank == 1:
            raise ValueError("boom from rank 1")
        out = step(launcher.put(x, P("data")))  # waits for rank 1 in the psum
        print("rank 0 finished; it should have been aborted", flush=True)
    elif mode == "mismatch":
        block = launcher.put(x, P("data"))
        if rank == 1:
            block = block[:, :4]
        step(block)
        print(f"rank {rank} ran a step with mismatched shapes", flush=True)
    elif mode == "die":
        launcher.fetch(step(launcher.put(x, P("data"))), P())
        print(f"rank {rank} stepped once", flush=True)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(100_000):  # rank 0 waits for rank 1 in the next psum
            launcher.fetch(step(launcher.put(x, P("data"))), P())
        print("rank 0 kept stepping without rank 1", flush=True)
    else:
        out = launcher.fetch(step(launcher.put(x, P("data"))), P())
        print(f"rank {rank} ok {out.tolist()}", flush=True)


def distributed_job(victim: int | None = None) -> None:
    import jax

    import jaxhc

    env = jaxhc.launch.init_distributed(heartbeat_timeout_s=30 if victim is None else 10)
    x = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    out = jaxhc.run(
        body,
        x,
        mesh_shape={"data": 4},
        in_specs=P("data"),
        out_specs=P(),
        transport="auto",
        fetch=True,
    )
    want = x.sum(0, keepdims=True)
    assert jax.process_count() == env.num_processes == 2, jax.process_count()
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    assert np.array_equal(out, want), (out, want)
    print(f"process {env.process_id} distributed ok {out.tolist()}", flush=True)
    if victim is not None:
        if env.process_id == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        launcher = jaxhc.Launcher({"data": 4}, "xla")
        step = launcher.shard_map(body, in_specs=P("data"), out_specs=P())
        for _ in range(100_000):  # the survivor waits for the victim in the next psum
            jax.block_until_ready(step(x))
        print(f"process {env.process_id} kept stepping without process {victim}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode.startswith("distributed"):
        distributed_job(int(mode[-1]) if mode.startswith("distributed-die") else None)
    else:
        mpi_job(mode)
