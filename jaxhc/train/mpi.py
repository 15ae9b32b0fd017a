"""Training with one process per device: `mpirun -np <mesh size> jaxhc train --transport mpi`.

Every rank runs `jaxhc.train.loop.run_loop` with an `MpiRunner`: it holds its own block of the
train state (its coordinate's slice of every array, as `jaxhc.Launcher.put` places it), runs the
same per-shard programs as the XLA transport (`per_shard_train_step`, `per_shard_eval_loss`) with
jaxhc's collectives over `MpiTransport`, and feeds its data rows of the same global batch (batches
depend only on (seed, step)). Rank 0 alone writes metrics.jsonl, config.json and the progress bar.
Checkpoints are sharded (`jaxhc.train.checkpoint`): every rank writes its own pieces of the global
arrays and reads its own block back, nothing is gathered; the format is the XLA loop's, so a run
checkpointed on one transport (and mesh) resumes on either (and on any mesh). The checkpoint
directory must be on a file system every rank sees.

Failures end the job rather than hang it: a bad configuration or a mesh that does not match
``-np`` is found by every rank before any communication (rank 0 prints the one-line error, every
rank exits with status 2); errors that only rank 0 can see (an existing run without --resume, a
missing or mismatched checkpoint) are broadcast first and end the job the same way; anything else
a rank raises aborts the whole job through `jaxhc.launch.install_abort_hook`.
"""

from __future__ import annotations

import socket
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxhc import partition
from jaxhc.launch import Launcher
from jaxhc.parallel import (
    METRIC_SPECS,
    TrainState,
    initial_state,
    per_shard_eval_loss,
    per_shard_train_step,
)
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Group, all_finite
from jaxhc.train.config import ExperimentConfig
from jaxhc.train.loop import Runner, check_config, run_loop, step_programs
from jaxhc.train.progress import Progress

TRAFFIC_FIELDS = ("raw_bytes", "wire_bytes", "fallbacks", "calls")


def train_mpi(
    cfg: ExperimentConfig, out_dir: str, *, resume: bool = False, progress: bool | Progress = True
) -> dict:
    """Train `cfg` as this rank of an MPI job of one process per mesh device (see the module).

    Returns the last step's record on rank 0 and {} on the other ranks. The records, files and
    checkpoints are those of `jaxhc.train.loop.train`; the losses are the XLA transport's.
    """
    if cfg.transport != "mpi":
        raise ValueError(f"transport={cfg.transport!r}: train_mpi runs the 'mpi' transport")
    try:
        import mpi4jax  # noqa: F401
        from mpi4py import MPI
    except ImportError as e:
        raise ValueError(
            f"--transport mpi needs mpi4py and mpi4jax ({e}): `make setup-mpi` installs them"
        ) from None
    world = MPI.COMM_WORLD
    # Checks every rank makes alike, before any communication: each rank can simply exit.
    try:
        if world.Get_size() != cfg.mesh.size:
            m = cfg.mesh
            raise ValueError(
                f"mesh data x tensor x pipe = {m.data} x {m.tensor} x {m.pipe} = {m.size} but the "
                f"MPI job has {world.Get_size()} processes: start it with `mpirun -np {m.size}`"
            )
        check_config(cfg, cfg.mesh.size)
    except ValueError:
        _exit_unless_rank0(world)
        raise
    runner = MpiRunner(cfg)
    try:
        return run_loop(cfg, out_dir, runner, resume=resume, progress=progress)
    except FloatingPointError:  # the loss is the same on every rank: let rank 0 report it
        _exit_unless_rank0(world, status=1)
        raise
    except AgreedError:
        raise
    except ValueError as e:  # one rank's error: the others may wait in a collective
        _abort(world, e)


class AgreedError(ValueError):
    """An error every rank knows about (rank 0 reports it; the others have exited quietly)."""


def _exit_unless_rank0(comm, status: int = 2) -> None:
    """On a failure every rank found alike: ranks other than 0 leave quietly, rank 0 reports."""
    if comm.Get_rank() != 0:
        raise SystemExit(status)


def _abort(comm, error: Exception) -> None:
    """End the whole job with this rank's one-line error (`MPI_Abort`, status 2)."""
    sys.stdout.flush()
    sys.stderr.write(f"jaxhc train: error: rank {comm.Get_rank()} of {comm.Get_size()}: {error}\n")
    sys.stderr.flush()
    comm.Abort(2)


class MpiRunner(Runner):
    """This rank's part of the loop: its blocks of the state, its rows of each batch."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        # The processes form the mesh the step runs on: "data" nested into the sharding plan's
        # sub-axes (`jaxhc.parallel.amsp`; the same ranks in the same order), and blocks are
        # placed with the specs on it; checkpoints name devices by ("data", "tensor", "pipe").
        shard = ShardPlan.of(cfg.mesh)
        self.mesh_shape = shard.view_shape(cfg.mesh)
        self.launcher = Launcher(self.mesh_shape, "mpi")
        grid = self.launcher.grid
        self.comm = grid.control
        self.coords = shard.mesh_coords(grid.coords)
        self.writer = grid.rank == 0
        self.group = MpiGroup(self.comm)
        self.all_coords = self.comm.allgather(grid.coords)
        where = f"{jax.devices()[0]} on {socket.gethostname()}"
        self.devices = [f"rank {r}: {d}" for r, d in enumerate(self.comm.allgather(where))]

        policy = cfg.policy
        self.plan = Plan(cfg.model, cfg.mesh, cfg.optim, policy)
        self.specs = shard.on_view(self.plan.state_specs)
        self.rows = P(shard.data_axis)
        self._steps = step_programs(cfg, self._make_step)
        self._eval = self.launcher.shard_map(
            per_shard_eval_loss(cfg.model, cfg.mesh, policy, shard.data_axis),
            in_specs=(self.specs.params, self.rows),
            out_specs=P(),
        )

    def _make_step(self, policy):
        cfg = self.cfg
        return self.launcher.shard_map(
            per_shard_train_step(
                cfg.model, cfg.mesh, cfg.optim, policy, cfg.train.fidelity_every, cfg.train.overlap
            ),
            in_specs=(self.specs, self.rows),
            out_specs=(self.specs, METRIC_SPECS),
            donate_argnums=0,  # the state is updated in place, as the XLA loop's is
        )

    def raise_if_any(self, error):
        errors = self.comm.allgather(error)
        first = next(((r, e) for r, e in enumerate(errors) if e), None)
        if first is None:
            return
        _exit_unless_rank0(self.comm)
        rank, error = first
        raise AgreedError(error if rank == 0 else f"rank {rank}: {error}")

    def _host_state(self, init=None):
        """The fresh global state as host arrays on rank 0; its structure elsewhere."""
        cfg = self.cfg
        if self.writer:
            params = None if init is None else init()
            return initial_state(
                cfg.model, cfg.mesh, cfg.optim, cfg.train.seed, params, policy=cfg.policy
            )
        return TrainState(0, self.plan.state_param_shapes, self.plan.opt_local)

    def init_state(self, init=None):
        # Rank 0 alone initializes (one compilation instead of one per rank) and sends the blocks.
        return self._scatter(self._host_state(init))

    def restore(self, checkpoints, state):
        leaves, error = None, None
        try:
            [(_, leaves)] = checkpoints.restore(self.plan, [self.coords])
        except ValueError as e:
            error = str(e)
        self.raise_if_any(error)
        return jax.tree.unflatten(jax.tree.structure(state), [jnp.asarray(x) for x in leaves])

    def _scatter(self, tree):
        """Rank 0's global host arrays -> every rank's blocks (elsewhere `tree` only gives the
        structure)."""

        def one(spec, x):
            blocks = None
            if self.writer:
                blocks = [
                    partition.local_block(spec, x, c, self.mesh_shape) for c in self.all_coords
                ]
            return jnp.asarray(self.comm.scatter(blocks, root=0))

        return partition.map_specs(one, self.specs, tree)

    def step(self, state, tokens, warm=False):
        rows = self.launcher.put(tokens, self.rows)
        state, metrics = self._steps[warm](state, rows)
        return state, jax.device_get(metrics)

    def eval_loss(self, params, tokens):
        return float(self._eval(params, self.launcher.put(tokens, self.rows)))

    def step_stats(self, ledger, seconds):
        # Each rank's ledger counts its own device; the XLA loop reports the mean over devices,
        # and the step takes as long as its slowest rank.
        mine = ledger.per_axis(devices=1)
        gathered = self.comm.allgather((mine, seconds))
        axes = sorted({a for traffic, _ in gathered for a in traffic})
        n = len(gathered)
        traffic = {
            a: {f: sum(t.get(a, {}).get(f, 0.0) for t, _ in gathered) / n for f in TRAFFIC_FIELDS}
            for a in axes
        }
        return traffic, max(s for _, s in gathered)

    def save(self, checkpoints, step, state):
        block = jax.tree.leaves(state)
        return checkpoints.save(step, self.plan, [(self.coords, block)], finite=all_finite(state))


class MpiGroup(Group):
    """The ranks of an MPI job, checkpointing together (small control messages only)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def all_gather(self, value):
        return self.comm.allgather(value)

    def bcast(self, value):
        return self.comm.bcast(value, root=0)

    def all_true(self, flag):
        return all(self.comm.allgather(bool(flag)))

    def first_error(self, error):
        errors = self.comm.allgather(error)
        return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)
