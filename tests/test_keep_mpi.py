"""``mesh.shard.gather: keep`` on the MPI transport, under mpirun (`jaxhc.parallel.keep`): the
layers' parameter gathers started a layer ahead in the forward and kept for the backward, the
gradients' reduce-scatters started in the backward. Bit for bit: the losses and the optimizer
state of ZeRO-1 (replicated parameters) on the same transport and the losses of the XLA
transport (the first step's gathers uncoded, the second's coded); every started call is finished.
"""

from __future__ import annotations

import jax
import mpi_helpers as h
import numpy as np
import pytest

pytestmark = [pytest.mark.mpi]

import mpi_started as s  # noqa: E402 (skips this module unless under mpirun, fused built)

SIZE, CONFIG = s.SIZE, s.CONFIG
TINY = ["model.n_embd=32", "model.block_size=16", "train.batch_size=8", "model.n_layer=3"]
POLICY = """\
name: data-zfp8
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8}
"""
# One level (the gathers and the first reduce-scatter started), and nested sub-axes.
# (nested: `make test-all`; CI time, the quick suite prefetches on nested sub-axes in
# tests/test_prefetch_mpi.py)
PLANS = {
    2: [pytest.param("flat", [f"mesh.data={SIZE}"], id="flat")],
    4: [
        pytest.param(
            "nested", ["mesh.data=4", "mesh.shard.groups=[2]"], id="nested", marks=pytest.mark.slow
        )
    ],
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return s.policy_file(tmp_path_factory, "data-zfp8.yaml", POLICY)


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


def _bits(xs):
    return [np.float32(x).tobytes() for x in xs]


@pytest.mark.parametrize(
    "which", [pytest.param("none", marks=pytest.mark.slow), "policy"]
)  # (none: make test-all; CI time)
@pytest.mark.parametrize("name, plan", PLANS.get(SIZE, []))
def test_keep_on_mpi_is_zero_1_and_the_xla_transport_bit_for_bit(name, plan, which, policy):
    chosen = policy if which == "policy" else "none"
    ref = h.Reference(lambda: h.xla_losses(_config(plan, chosen, True)))
    keep_losses, keep, starts, _, left = s.train(_config(plan, chosen, True))
    zero_losses, zero1, *_ = s.train(_config(plan, chosen, False))
    ref = ref.get()
    bad = []
    if not starts:
        bad.append(f"{name}: no started calls in the step's program")
    for label, other in (("ZeRO-1", zero_losses), ("XLA", ref)):
        if _bits(keep_losses) != _bits(other):
            bad.append(f"{name} {which}: losses {keep_losses} (keep) vs {other} ({label})")
    leaves = zip(jax.tree.leaves(keep.opt_state), jax.tree.leaves(zero1.opt_state), strict=True)
    if not all(h.bits_equal(a, b) for a, b in leaves):
        bad.append(f"{name} {which}: an optimizer state block differs from ZeRO-1's")
    if left:
        bad.append(f"{name}: {left} started calls never done")
    h.assert_on_every_rank(bad)
