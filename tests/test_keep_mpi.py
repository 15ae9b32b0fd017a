"""``mesh.shard.gather: keep`` on the MPI transport, under mpirun (`jaxhc.parallel.keep`): the
layers' parameter gathers started a layer ahead in the forward and kept for the backward, the
gradients' reduce-scatters started in the backward. Bit for bit: the losses and the optimizer
state of ZeRO-1 (replicated parameters) on the same transport and the losses of the XLA
transport (the first step's gathers uncoded, the second's coded); every started call is finished.
"""

from __future__ import annotations

from pathlib import Path

import jax
import mpi_helpers as h
import numpy as np
import pytest

pytestmark = [pytest.mark.mpi]

h.skip_unless_fused_under_mpirun()

from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.transport import _mpi_fused  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "experiments" / "default.yaml"
TINY = ["model.n_embd=32", "model.block_size=16", "train.batch_size=8", "model.n_layer=3"]
POLICY = """\
name: data-zfp8
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8}
"""
# One level (the gathers and the first reduce-scatter started), and nested sub-axes.
PLANS = {
    2: [("flat", [f"mesh.data={SIZE}"])],
    4: [("nested", ["mesh.data=4", "mesh.shard.groups=[2]"])],
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "data-zfp8.yaml"
    if RANK == 0:
        path.write_text(POLICY)
    path = WORLD.bcast(str(path) if RANK == 0 else None, root=0)
    WORLD.Barrier()
    return path


def _config(plan, policy, keep: bool):
    from jaxhc.train.config import load

    shard = [f"mesh.shard.params={SIZE}", "mesh.shard.gather=keep"] if keep else []
    return load(
        str(CONFIG),
        TINY
        + plan
        + shard
        + ["mesh.tensor=1", "mesh.pipe=1", "mesh.microbatches=1"]
        + [f"compression={policy}", "transport=mpi", "train.overlap=true"],
    )


def _train(cfg, steps: int = 2):
    """(losses, this rank's opt_state blocks, starts in the step's program, calls left)."""
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
    for _ in range(steps):
        tokens = rng.integers(0, cfg.model.vocab_size, (8, 17), dtype=np.int32)
        state, metrics = runner.step(state, tokens)
        losses.append(np.float32(metrics["loss"]))
    opt = jax.tree.map(np.asarray, state.opt_state)
    return losses, opt, starts, _mpi_fused.outstanding()


def _bits(xs):
    return [np.float32(x).tobytes() for x in xs]


@pytest.mark.parametrize(
    "which", [pytest.param("none", marks=pytest.mark.slow), "policy"]
)  # (none: make test-all; CI time)
@pytest.mark.parametrize("name, plan", PLANS.get(SIZE, []), ids=[p[0] for p in PLANS.get(SIZE, [])])
def test_keep_on_mpi_is_zero_1_and_the_xla_transport_bit_for_bit(name, plan, which, policy):
    chosen = policy if which == "policy" else "none"
    keep_losses, keep, starts, left = _train(_config(plan, chosen, True))
    zero_losses, zero1, *_ = _train(_config(plan, chosen, False))
    ref = h.xla_losses(_config(plan, chosen, True)) if RANK == 0 else None
    ref = WORLD.bcast(ref, root=0)
    bad = []
    if not starts:
        bad.append(f"{name}: no started calls in the step's program")
    for label, other in (("ZeRO-1", zero_losses), ("XLA", ref)):
        if _bits(keep_losses) != _bits(other):
            bad.append(f"{name} {which}: losses {keep_losses} (keep) vs {other} ({label})")
    leaves = zip(jax.tree.leaves(keep), jax.tree.leaves(zero1), strict=True)
    if not all(h.bits_equal(a, b) for a, b in leaves):
        bad.append(f"{name} {which}: an optimizer state block differs from ZeRO-1's")
    if left:
        bad.append(f"{name}: {left} started calls never done")
    h.assert_on_every_rank(bad)
