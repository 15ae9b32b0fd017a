"""ZeRO-3 parameter gathers started a layer ahead on the MPI transport (`jaxhc.parallel.prefetch`
over `jaxhc.collectives.started.all_gather_start`), under mpirun, against the synchronous
gathers and the XLA transport, bit for bit.

A started all-gather gives the synchronous `jaxhc.all_gather`'s values and ledger records,
several in flight at once with a synchronous call on another communicator in between. The train
step with per-layer ZeRO-3 and ``train.overlap`` on gives the losses and every state block of the
same step with it off (each layer's gathers waited for where they run), and the XLA transport's
losses, with the same ledger; every call it starts is finished (none outstanding after a step),
and each finish takes its own call (a done of another layer's gather would give other bits, of
another level or of no call at all an engine error).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mpi_helpers as h
import mpi_started as s
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc.collectives import started
from jaxhc.transport import _mpi_fused

pytestmark = [pytest.mark.mpi]
SIZE, LAYERS = s.SIZE, s.LAYERS


def _bodies(codec, tiled):
    """(started, synchronous) per-shard programs: an all-gather of each of LAYERS rows started
    in one scan and finished in another, a synchronous psum over ("x", "y") in between."""

    def sync(rows):
        got = lax.map(lambda r: jaxhc.all_gather(r, "x", tiled=tiled, codec=codec), rows)
        return got[None], jaxhc.psum(jnp.sin(rows), ("x", "y"))

    def overlapped(rows):
        call = {}

        def begin(_, r):
            call["s"] = started.all_gather_start(r * 1.0, "x", tiled=tiled, codec=codec)
            return None, call["s"].handle

        handles = lax.scan(begin, None, rows)[1]
        side = jaxhc.psum(jnp.sin(rows), ("x", "y"))  # the calling thread's, meanwhile
        got = lax.scan(
            lambda _, hd: (None, started.all_gather_done(call["s"].like(hd))), None, handles
        )[1]
        return got[None], side

    return overlapped, sync


@functools.cache
def _programs(codec, tiled):
    specs = dict(in_specs=P(None, "x"), out_specs=(P("x"), P(None, "x")))
    return s.programs(*_bodies(codec, tiled), specs)


@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("codec", [None, "zfp:8", "mpc"])
def test_started_all_gathers_match_the_synchronous_ones(codec, tiled):
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((LAYERS, SIZE * 5003)).astype(np.float32)
    rows *= np.geomspace(1e-3, 1e3, rows.shape[1], dtype=np.float32)
    launcher, overlapped, sync, xla = _programs(codec, tiled)
    ref = h.Reference(lambda: jax.tree.map(np.asarray, xla(rows)))
    got, want, on, off = s.run_both(overlapped, sync, launcher.put(rows, P(None, "x")))
    ref = ref.get()
    bad = []
    shape = (1, LAYERS, SIZE * 5003) if tiled else (1, LAYERS, SIZE, 5003)
    if got[0].shape != shape:
        bad.append(f"{codec}: gathered {got[0].shape}, not {shape}")
    specs = (P("x"), P(None, "x"))
    bad += s.mismatches(
        f"{codec} tiled={tiled}", launcher, ("gather", "side"), got, want, ref, specs
    )
    if on != off:
        bad.append(f"{codec} tiled={tiled}: ledger {on} != {off}")
    if _mpi_fused.outstanding():
        bad.append(f"{_mpi_fused.outstanding()} started calls not done")
    h.assert_on_every_rank(bad)


def test_an_all_gather_that_cannot_start_says_so():
    launcher, *_ = _programs(None, True)
    with jaxhc.transport.use(launcher.transport):
        like = jax.ShapeDtypeStruct((8,), jnp.float32)
        assert started.can_start(like, "x", codec="mpc")
        assert not started.can_start(like, "x", codec="q8:sr")  # stochastic rounding: not fused
        with pytest.raises(ValueError, match=r"all_gather of \(8,\) float32 over 'x' cannot be"):
            started.all_gather_start(jnp.zeros(8), "x", tiled=True, codec="q8:sr")
        with pytest.raises(ValueError, match="a tiled gather needs an array"):
            started.all_gather_start(jnp.float32(1), "x", tiled=True)


# --- the train step ------------------------------------------------------------------------------

TINY = ["model.n_embd=32", "model.block_size=16", "train.batch_size=8"]
# Every message compressed, the parameter gathers by zfp (each level's own call).
POLICY = """\
name: every-message
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8}
  tensor: {codec: mpc, budget: 0.95}
  pipe: {codec: zfp, rate: 16}
"""
# ZeRO-3 per layer: on one level, on nested sub-axes (two started levels: a layer's first level
# begins two layers ahead), beside pipeline stages with micro-batches.
PLANS = {
    2: [
        pytest.param(
            "flat-micro2",
            ["model.n_layer=3", "mesh.data=2", "mesh.microbatches=2"],
            "policy",
            id="flat-micro2",
        )
    ],
    4: [
        pytest.param(
            "nested",
            ["model.n_layer=3", "mesh.data=4", "mesh.shard.groups=[2]", "mesh.microbatches=1"],
            "policy",
            id="nested",
        ),
        pytest.param(  # make test-all (CI time); np 2 runs a flat plan with micro-batches
            "pipe2-micro2",
            ["model.n_layer=4", "mesh.data=2", "mesh.pipe=2", "mesh.microbatches=2"],
            "none",
            id="pipe2-micro2",
            marks=pytest.mark.slow,
        ),
    ],
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return s.policy_file(tmp_path_factory, "every-message.yaml", POLICY)


def _config(plan: list[str], policy: str, overlap: bool):
    from jaxhc.train.config import load

    data = next(int(o.split("=")[1]) for o in plan if o.startswith("mesh.data="))
    pipe = next((int(o.split("=")[1]) for o in plan if o.startswith("mesh.pipe=")), 1)
    extra = [f"mesh.shard.params={data}", "mesh.tensor=1", f"mesh.pipe={pipe}"]
    return load(
        str(s.CONFIG),
        TINY
        + plan
        + extra
        + [f"compression={policy}", "transport=mpi", f"train.overlap={str(overlap).lower()}"],
    )


@pytest.mark.parametrize("name, plan, which", PLANS.get(SIZE, []))
def test_prefetched_zero3_training_gives_the_same_bits(name, plan, which, policy):
    """Losses, every state block and the ledger bit for bit with the parameter gathers started
    ahead and without; the losses the XLA transport's."""
    chosen = policy if which == "policy" else which
    on_cfg, off_cfg = _config(plan, chosen, True), _config(plan, chosen, False)
    ref = h.Reference(lambda: h.xla_losses(on_cfg))
    on, off = s.train(on_cfg, ledger=True), s.train(off_cfg, ledger=True)
    (*_, starts, on_ledger, on_left), (*_, none, off_ledger, _) = on, off
    ref = ref.get()
    bad = []
    if not starts or none:
        bad.append(f"{name}: {starts} started calls in the program with overlap, {none} without")
    bad += s.same_training(name, "prefetch", on, off, ref)
    if on_ledger != off_ledger:
        bad.append(f"{name}: ledger {on_ledger} (prefetch) vs {off_ledger}")
    if on_left:
        bad.append(f"{name}: {on_left} started calls never done")
    h.assert_on_every_rank(bad)
