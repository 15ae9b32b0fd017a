"""One ring model: the raw bytes the ledger records for every plain collective, the planner's
`Comm.raw` and the link profiler's `ring_bytes` are `jaxhc.collectives.volume.raw`'s."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxhc
from jaxhc.collectives import volume
from jaxhc.plan.comm import Comm
from jaxhc.plan.profile import ring_bytes
from tests._mesh import mesh_of, run

SHAPE = (16, 12)  # float32 per shard: 768 bytes
PARTS = 4
NBYTES = 4 * SHAPE[0] * SHAPE[1]
SHIFT = [(i, i + 1) for i in range(PARTS - 1)]  # a pipeline's shift: the last rank sends nothing

CALLS = {
    "psum": lambda x: jaxhc.psum(x, "x"),
    "psum_scatter": lambda x: jaxhc.psum_scatter(x, "x", scatter_dimension=1, tiled=True),
    "all_gather": lambda x: jaxhc.all_gather(x, "x", axis=1, tiled=True),
    "all_to_all": lambda x: jaxhc.all_to_all(x, "x", 1, 2, tiled=True),
    "ppermute": lambda x: jaxhc.ppermute(x, "x", SHIFT),
    "psum_pair": lambda x: jaxhc.psum_pair(x, "x", (0, PARTS - 1)),
}


@pytest.mark.parametrize("op", list(CALLS))
def test_the_ledger_records_volume_raw(op):
    mesh, _ = mesh_of("1d4")
    x = np.ones((PARTS, *SHAPE), np.float32)  # a (1, *SHAPE) block per rank
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(run(CALLS[op], mesh, x))
        jax.effects_barrier()
    got = ledger.per_axis(devices=PARTS)["x"]
    assert got["calls"] == 1
    assert got["raw_bytes"] == pytest.approx(volume.raw(op, PARTS, NBYTES), rel=1e-12)


@pytest.mark.parametrize("op", volume.RAW_OPS)
def test_the_planner_charges_volume_raw(op):
    if op == "all_to_all":  # a step's Comm never is one: it moves a codec's payloads (legs)
        return
    comm = Comm("data", "grad", op, PARTS, PARTS, NBYTES // 4, 4, 1)
    assert comm.raw == volume.raw(op, PARTS, NBYTES)
    assert comm.legs() == [(op, volume.steps(op, PARTS), comm.raw)]


@pytest.mark.parametrize("op", volume.OPS)
def test_the_profiler_fits_volume_raw(op):
    """An all-gather's larger buffer is its output: `PARTS` times what a rank passes in."""
    values = 1 << 12
    message = 4 * values // PARTS if op == "all_gather" else 4 * values
    want = (volume.steps(op, PARTS), volume.raw(op, PARTS, message))
    assert ring_bytes(op, PARTS, values) == want


def test_an_unknown_op_is_refused():
    with pytest.raises(ValueError, match="'gather' is not one of"):
        volume.raw("gather", PARTS, NBYTES)
    with pytest.raises(ValueError, match="'gather' is not one of"):
        volume.steps("gather", PARTS)
