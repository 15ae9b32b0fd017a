"""Shared pieces of the MPI tests of started collectives (tests/test_overlap_mpi.py and
tests/test_prefetch_mpi.py): importing this module skips the importing test module unless it runs
under mpirun with the fused MPI collectives built; then the world, the programs compared (started,
synchronous, and the synchronous one on the XLA transport), the comparisons, the train runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import mpi_helpers as h

h.skip_unless_fused_under_mpirun()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.partition import local_block  # noqa: E402
from jaxhc.transport import _mpi_fused  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
LAYERS = 3
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "experiments" / "default.yaml"


def programs(overlapped, sync, specs: dict):
    """(launcher, the started program, the synchronous one, the synchronous one on the XLA
    transport) of per-shard bodies on an {"x": SIZE, "y": 1} mesh."""
    launcher = jaxhc.Launcher({"x": SIZE, "y": 1}, "mpi")
    xla = jaxhc.Launcher({"x": SIZE, "y": 1}, "xla").shard_map(sync, **specs)
    return launcher, launcher.shard_map(overlapped, **specs), launcher.shard_map(sync, **specs), xla


def run_both(overlapped, sync, *args):
    """(the started program's outputs, the synchronous one's, their ledgers over "x")."""
    with jaxhc.accounting.Ledger() as on_ledger:
        got = jax.block_until_ready(overlapped(*args))
    with jaxhc.accounting.Ledger() as off_ledger:
        want = jax.block_until_ready(sync(*args))
    return got, want, on_ledger.per_axis(devices=1)["x"], off_ledger.per_axis(devices=1)["x"]


def mismatches(label: str, launcher, names, got, want, ref, specs) -> list[str]:
    """Each output (by name) whose bits differ between the started and the synchronous program,
    or from this rank's block (`specs`) of the XLA transport's `ref`."""
    bad = []
    coords, shape = launcher.grid.coords, launcher.mesh_shape
    for name, g, w, r, spec in zip(names, got, want, ref, specs, strict=True):
        if not h.bits_equal(g, w):
            bad.append(f"{label} {name}: started != synchronous")
        if not h.bits_equal(g, local_block(spec, r, coords, shape)):
            bad.append(f"{label} {name}: MPI != XLA")
    return bad


def train(cfg, steps: int = 2, ledger: bool = False):
    """(losses, this rank's state blocks, started calls in the step's program, the ledger per
    axis and kind (None unless `ledger`), started calls left) after `steps` of `jaxhc train
    --transport mpi`'s step of `cfg` (its ``train.overlap``), on `h.xla_losses`'s batches."""
    from jaxhc.parallel import per_shard_train_step
    from jaxhc.train.mpi import MpiRunner

    runner = MpiRunner(cfg)
    state = runner.init_state()
    step = per_shard_train_step(cfg.model, cfg.mesh, cfg.optim, cfg.policy, 0, cfg.train.overlap)
    rows = runner.launcher.put(np.zeros((8, 17), np.int32), runner.rows)
    with jaxhc.transport.use(runner.launcher.transport):
        starts = str(jax.make_jaxpr(step)(state, rows)).count("jaxhc_mpi_start")
    rng = np.random.default_rng(0)
    losses = []
    with jaxhc.accounting.Ledger() if ledger else contextlib.nullcontext() as book:
        for _ in range(steps):
            tokens = rng.integers(0, cfg.model.vocab_size, (8, 17), dtype=np.int32)
            state, metrics = runner.step(state, tokens)
            losses.append(np.float32(metrics["loss"]))
    by_kind = book.per_axis(devices=1, by_kind=True) if ledger else None
    return losses, jax.tree.map(np.asarray, state), starts, by_kind, _mpi_fused.outstanding()


def same_training(name: str, label: str, on, off, ref) -> list[str]:
    """What differs between the runs `on` (with `label`: overlap, prefetch) and `off` (`train`'s
    losses and state blocks), and between `on`'s losses and the XLA transport's `ref`."""
    (on_losses, on_state, *_), (off_losses, off_state, *_) = on, off
    bad = []
    if [x.tobytes() for x in on_losses] != [x.tobytes() for x in off_losses]:
        bad.append(f"{name}: losses {on_losses} ({label}) vs {off_losses}")
    if [x.tobytes() for x in on_losses] != [np.float32(x).tobytes() for x in ref]:
        bad.append(f"{name}: losses {on_losses} (MPI) vs {ref} (XLA)")
    for a, b in zip(jax.tree.leaves(on_state), jax.tree.leaves(off_state), strict=True):
        if not h.bits_equal(a, b):
            bad.append(f"{name}: a state block differs with {label}")
            break
    return bad


def policy_file(tmp_path_factory, name: str, text: str) -> str:
    """`text` written once (rank 0) to a file every rank gets the path of."""
    path = tmp_path_factory.mktemp("policy") / name
    if RANK == 0:
        path.write_text(text)
    path = WORLD.bcast(str(path) if RANK == 0 else None, root=0)
    WORLD.Barrier()
    return path
