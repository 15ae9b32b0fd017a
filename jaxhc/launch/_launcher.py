"""One entry point for per-shard programs: `shard_map` on XLA devices, or MPI processes."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxhc import context, partition
from jaxhc.launch._env import ProcessEnv
from jaxhc.launch._guard import check_agreement, describe, install_abort_hook
from jaxhc.transport import XlaTransport

TRANSPORTS = ("xla", "mpi", "auto")
_GRIDS: dict = {}


def init_mpi(mesh_shape: Mapping[str, int], *, abort_on_error: bool = True, select_device=True):
    """The MPI process grid for `mesh_shape` (cached), after MPI_Init.

    `abort_on_error` installs the hook that ends the whole job when a rank raises. With
    `select_device`, a process that shares its node with others sees only its own GPU
    (CUDA_VISIBLE_DEVICES=local rank, unless already set); call this before jax touches a GPU.

    >>> from jaxhc.launch import init_mpi
    >>> init_mpi({"data": 1}).coords     # one process; under mpirun -np 4 a {"data": 4} grid
    {'data': 0}
    """
    from jaxhc.transport.mpi import ProcessGrid

    env = ProcessEnv.from_env()
    if select_device and env.local_size and env.local_size > 1:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(env.local_rank))
    if abort_on_error:  # first, so that even a bad mesh ends the job with its message
        install_abort_hook()
    key = tuple((str(a), int(s)) for a, s in mesh_shape.items())
    if key not in _GRIDS:
        _GRIDS[key] = ProcessGrid(dict(key))
    return _GRIDS[key]


def init_distributed(
    env: ProcessEnv | None = None,
    *,
    local_device_ids=None,
    cpu_collectives="gloo",
    heartbeat_timeout_s: int = 30,
    gloo_hostname: str | None = None,
    gloo_interface: str | None = None,
):
    """`jax.distributed.initialize` from mpirun / SLURM / JAXHC_* variables (no-op for one process).

    On CPU, cross-process collectives go through `cpu_collectives` ("gloo" over TCP). Gloo listens
    on the address this machine's host name resolves to, unless `gloo_hostname` (a name or an IP
    address; default $JAXHC_GLOO_HOSTNAME) or `gloo_interface` (a network interface such as
    "eth1"; default $JAXHC_GLOO_INTERFACE) says otherwise: on hosts with several networks, name
    the one the processes reach each other on. A process that dies (killed, crashed) stops
    sending heartbeats; after `heartbeat_timeout_s` jax's coordination service ends every other
    process with "Task <id> heartbeat timeout" (jax's own default, 100 s, leaves the others
    hanging in their collectives for that long). Returns the `ProcessEnv` used.

    >>> from jaxhc.launch import ProcessEnv, init_distributed
    >>> env = init_distributed(ProcessEnv.from_env({}))   # one process: nothing to initialize
    >>> env.multi_process, env.num_processes
    (False, 1)
    """
    env = env or ProcessEnv.from_env()
    gloo_hostname = gloo_hostname or os.environ.get("JAXHC_GLOO_HOSTNAME") or None
    gloo_interface = gloo_interface or os.environ.get("JAXHC_GLOO_INTERFACE") or None
    if not env.multi_process:
        return env
    if env.coordinator is None:
        raise RuntimeError(
            f"cannot tell the jax.distributed coordinator from the {env.source} environment: "
            "set JAXHC_COORDINATOR=host:port"
        )
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=env.coordinator,
        num_processes=env.num_processes,
        process_id=env.process_id,
        local_device_ids=local_device_ids,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    if cpu_collectives == "gloo" and (gloo_hostname or gloo_interface):
        from jaxhc.launch._cpu import use_gloo_address

        use_gloo_address(gloo_hostname, gloo_interface)
    return env


def resolve_transport(transport: str) -> str:
    """ "auto": "mpi" when started as several processes (mpirun/srun) without jax.distributed.

    >>> from jaxhc.launch import resolve_transport
    >>> resolve_transport("xla"), resolve_transport("auto")     # one process here
    ('xla', 'xla')
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r} must be one of {TRANSPORTS}")
    if transport != "auto":
        return transport
    if jax.distributed.is_initialized():
        return "xla"
    return "mpi" if ProcessEnv.from_env().multi_process else "xla"


class Launcher:
    """Runs per-shard functions (what one passes to `jax.shard_map`) over a mesh, either transport.

    - ``transport="xla"``: `shard_map` over this process's devices, or every process's after
      `init_distributed`. Values are global `jax.Array`s sharded by their specs.
    - ``transport="mpi"``: one process per device under `mpirun -np <devices>`; rank r is the
      device at row-major mesh coordinate r. Values are this process's local blocks.

    Either way `put` makes values from global host arrays, the step function returned by
    `shard_map` takes and returns such values, and `fetch` turns them back into global numpy
    arrays on every process. Under MPI each step first checks (one 8-byte allgather, off with
    ``check_args=False``) that all ranks pass the same shapes and dtypes, and an uncaught exception
    on any rank aborts the job (``abort_on_error``). Per-shard code must use jaxhc's collectives and
    `jaxhc.axis_index` / `jaxhc.axis_size` (not `jax.lax`'s), and see `shard_map(check_vma=False)`
    semantics (explicit gradient reductions), which is what the MPI transport provides.

    >>> from jax.sharding import PartitionSpec as P
    >>> from jaxhc import Launcher
    >>> def body(x):                                 # this rank's (1, 4) block
    ...     return jaxhc.psum(x, "data", codec="mpc")
    >>> launcher = Launcher({"data": 2}, transport="auto")   # "mpi" under mpirun -np 2
    >>> step = launcher.shard_map(body, in_specs=P("data"), out_specs=P())
    >>> x = launcher.put(np.arange(8, dtype=np.float32).reshape(2, 4), P("data"))
    >>> launcher.fetch(step(x), P())
    array([[ 4.,  6.,  8., 10.]], dtype=float32)
    """

    def __init__(
        self,
        mesh_shape: Mapping[str, int],
        transport: str = "auto",
        *,
        check_vma: bool = False,
        psum: str = "exact",
        devices=None,
        abort_on_error: bool = True,
        check_args: bool = True,
    ):
        self.mesh_shape = {str(a): int(s) for a, s in mesh_shape.items()}
        self.transport_name = resolve_transport(transport)
        self.check_vma = check_vma
        self.check_args = check_args
        names, shape = tuple(self.mesh_shape), tuple(self.mesh_shape.values())
        if self.transport_name == "mpi":
            from jaxhc.transport.mpi import MpiTransport

            self.grid = init_mpi(self.mesh_shape, abort_on_error=abort_on_error)
            self.transport = MpiTransport(self.grid, psum=psum)
            self.mesh = None
        else:
            devices = list(jax.devices() if devices is None else devices)
            need = math.prod(shape)
            if len(devices) < need or (jax.process_count() > 1 and len(devices) != need):
                raise ValueError(
                    f"the mesh {self.mesh_shape} needs {need} devices; there are {len(devices)}"
                )
            self.mesh = Mesh(np.asarray(devices[:need], dtype=object).reshape(shape), names)
            self.transport = XlaTransport()
            self.grid = None

    # --- placing and fetching values --------------------------------------------------------

    def put(self, tree, specs):
        """Global host arrays -> this transport's values: sharded global arrays, or local blocks."""
        if self.grid is not None:
            coords = self.grid.coords
            return partition.map_specs(
                lambda s, x: jnp.asarray(partition.local_block(s, x, coords, self.mesh_shape)),
                specs,
                tree,
            )
        return partition.map_specs(self._put_xla, specs, tree)

    def _put_xla(self, spec, x):
        sharding = NamedSharding(
            self.mesh, spec if spec is not None else jax.sharding.PartitionSpec()
        )
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    def fetch(self, tree, specs):
        """This transport's values -> the global numpy arrays, on every process."""
        if self.grid is not None:
            all_coords = self.grid.control.allgather(self.grid.coords)
            return partition.map_specs(
                lambda s, x: partition.assemble(
                    s, self.grid.control.allgather(np.asarray(x)), all_coords, self.mesh_shape
                ),
                specs,
                tree,
            )
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            return jax.tree.map(
                lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree
            )
        return jax.tree.map(np.asarray, tree)

    # --- running per-shard functions ----------------------------------------------------------

    def shard_map(self, fn: Callable, *, in_specs, out_specs, donate_argnums=()) -> Callable:
        """A jitted step running `fn` on every shard; call it with values made by `put`.

        `donate_argnums` as in `jax.jit`: those arguments' buffers may hold the results (a train
        state updated in place); do not use a donated argument after the call.
        """
        transport = self.transport

        @functools.wraps(fn)
        def traced(*args):
            with context.use(transport=transport):
                return fn(*args)

        if self.grid is None:
            mapped = jax.shard_map(
                traced,
                mesh=self.mesh,
                in_specs=in_specs,
                out_specs=out_specs,
                check_vma=self.check_vma,
            )
            jitted = jax.jit(mapped, donate_argnums=donate_argnums)

            def step_xla(*args):
                return jitted(*self.put(args, in_specs))

            return functools.wraps(fn)(step_xla)

        jitted = jax.jit(traced, donate_argnums=donate_argnums)
        name = getattr(fn, "__qualname__", repr(fn))
        control = self.grid.control

        def step_mpi(*args):
            # Before any collective runs: every rank must call with the same shapes, else abort.
            if self.check_args:
                check_agreement(control, f"the arguments of {name}", describe(args))
            return jitted(*args)

        return functools.wraps(fn)(step_mpi)

    def run(self, fn: Callable, *args, in_specs, out_specs, fetch: bool = False):
        """`put` the global `args`, run `fn` per shard, return values (or global numpy arrays)."""
        out = self.shard_map(fn, in_specs=in_specs, out_specs=out_specs)(*self.put(args, in_specs))
        return self.fetch(out, out_specs) if fetch else out


def run(
    fn: Callable,
    *args,
    mesh_shape: Mapping[str, int],
    in_specs,
    out_specs,
    transport: str = "auto",
    fetch: bool = False,
    **launcher_options,
):
    """Run the per-shard `fn` over a mesh with either transport (see `Launcher`).

    `args` are global host arrays; each shard gets its block by `in_specs`. Returns the transport's
    values (MPI: this process's output block; XLA: global arrays), or with ``fetch=True`` the
    global outputs as numpy arrays on every process.

    >>> import numpy as np, jaxhc
    >>> from jax.sharding import PartitionSpec as P
    >>> def body(x):
    ...     return jaxhc.psum(x, "data", codec="none")
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> jaxhc.run(body, x, mesh_shape={"data": 2}, in_specs=P("data"), out_specs=P(),
    ...           transport="xla", fetch=True)
    array([[ 4.,  6.,  8., 10.]], dtype=float32)
    """
    launcher = Launcher(mesh_shape, transport, **launcher_options)
    return launcher.run(fn, *args, in_specs=in_specs, out_specs=out_specs, fetch=fetch)
