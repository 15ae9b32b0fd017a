"""Multi-process runs: one entry point over a mesh with the XLA or the MPI transport.

`Launcher` / `run` run a per-shard function (what one passes to `jax.shard_map`) either with
`shard_map` on XLA devices (local, or every process's after `init_distributed`) or with one MPI
process per device (`mpirun -np <devices>`), where jaxhc's collectives go through mpi4jax.
`ProcessEnv` reads a process's place in the job from mpirun, SLURM or JAXHC_* variables;
`set_cpu_device_count` gives jax's CPU backend the host devices a run needs, before it starts.

>>> from jax.sharding import PartitionSpec as P
>>> jaxhc.launch.run(lambda x: jaxhc.psum(x, "data"), np.ones((2, 3), np.float32),
...                  mesh_shape={"data": 2}, in_specs=P("data"), out_specs=P(), fetch=True)
array([[2., 2., 2.]], dtype=float32)
"""

from jaxhc.launch._cpu import set_cpu_device_count as set_cpu_device_count
from jaxhc.launch._env import ProcessEnv as ProcessEnv
from jaxhc.launch._env import first_host as first_host
from jaxhc.launch._env import host_devices as host_devices
from jaxhc.launch._guard import RankMismatchError as RankMismatchError
from jaxhc.launch._guard import check_agreement as check_agreement
from jaxhc.launch._guard import install_abort_hook as install_abort_hook
from jaxhc.launch._launcher import Launcher as Launcher
from jaxhc.launch._launcher import init_distributed as init_distributed
from jaxhc.launch._launcher import init_mpi as init_mpi
from jaxhc.launch._launcher import resolve_transport as resolve_transport
from jaxhc.launch._launcher import run as run

__all__ = [
    "Launcher",
    "ProcessEnv",
    "RankMismatchError",
    "check_agreement",
    "first_host",
    "host_devices",
    "init_distributed",
    "init_mpi",
    "install_abort_hook",
    "resolve_transport",
    "run",
    "set_cpu_device_count",
]
