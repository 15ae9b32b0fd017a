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
from pathlib import Path

import jax
import jax.numpy as jnp
import mpi_helpers as h
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.mpi]

h.skip_unless_fused_under_mpirun()

from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.collectives import started  # noqa: E402
from jaxhc.partition import local_block  # noqa: E402
from jaxhc.transport import _mpi_fused  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
LAYERS = 3
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "experiments" / "default.yaml"


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
    launcher = jaxhc.Launcher({"x": SIZE, "y": 1}, "mpi")
    overlapped, sync = _bodies(codec, tiled)
    specs = dict(in_specs=P(None, "x"), out_specs=(P("x"), P(None, "x")))
    xla = jaxhc.Launcher({"x": SIZE, "y": 1}, "xla").shard_map(sync, **specs)
    return launcher, launcher.shard_map(overlapped, **specs), launcher.shard_map(sync, **specs), xla


@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("codec", [None, "zfp:8", "mpc"])
def test_started_all_gathers_match_the_synchronous_ones(codec, tiled):
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((LAYERS, SIZE * 5003)).astype(np.float32)
    rows *= np.geomspace(1e-3, 1e3, rows.shape[1], dtype=np.float32)
    launcher, overlapped, sync, xla = _programs(codec, tiled)
    ref = jax.tree.map(np.asarray, xla(rows)) if RANK == 0 else None
    ref = WORLD.bcast(ref, root=0)
    x = launcher.put(rows, P(None, "x"))
    with jaxhc.accounting.Ledger() as on_ledger:
        got = jax.block_until_ready(overlapped(x))
    with jaxhc.accounting.Ledger() as off_ledger:
        want = jax.block_until_ready(sync(x))
    bad = []
    shape = (1, LAYERS, SIZE * 5003) if tiled else (1, LAYERS, SIZE, 5003)
    if got[0].shape != shape:
        bad.append(f"{codec}: gathered {got[0].shape}, not {shape}")
    specs = (P("x"), P(None, "x"))
    for name, g, w, r, spec in zip(("gather", "side"), got, want, ref, specs, strict=True):
        if not h.bits_equal(g, w):
            bad.append(f"{codec} tiled={tiled} {name}: started != synchronous")
        if not h.bits_equal(g, local_block(spec, r, launcher.grid.coords, launcher.mesh_shape)):
            bad.append(f"{codec} tiled={tiled} {name}: MPI != XLA")
    on, off = on_ledger.per_axis(devices=1)["x"], off_ledger.per_axis(devices=1)["x"]
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
    2: [("flat-micro2", ["model.n_layer=3", "mesh.data=2", "mesh.microbatches=2"], "policy")],
    4: [
        (
            "nested",
            ["model.n_layer=3", "mesh.data=4", "mesh.shard.groups=[2]", "mesh.microbatches=1"],
            "policy",
        ),
        (
            "pipe2-micro2",
            ["model.n_layer=4", "mesh.data=2", "mesh.pipe=2", "mesh.microbatches=2"],
            "none",
        ),
    ],
}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "every-message.yaml"
    if RANK == 0:
        path.write_text(POLICY)
    path = WORLD.bcast(str(path) if RANK == 0 else None, root=0)
    WORLD.Barrier()
    return path


def _config(plan: list[str], policy: str, overlap: bool):
    from jaxhc.train.config import load

    data = next(int(o.split("=")[1]) for o in plan if o.startswith("mesh.data="))
    pipe = next((int(o.split("=")[1]) for o in plan if o.startswith("mesh.pipe=")), 1)
    extra = [f"mesh.shard.params={data}", "mesh.tensor=1", f"mesh.pipe={pipe}"]
    return load(
        str(CONFIG),
        TINY
        + plan
        + extra
        + [f"compression={policy}", "transport=mpi", f"train.overlap={str(overlap).lower()}"],
    )


def _train(cfg, steps: int = 2):
    """(losses, this rank's state blocks, starts in the step's program, ledger, calls left)."""
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
    with jaxhc.accounting.Ledger() as ledger:
        for _ in range(steps):
            tokens = rng.integers(0, cfg.model.vocab_size, (8, 17), dtype=np.int32)
            state, metrics = runner.step(state, tokens)
            losses.append(np.float32(metrics["loss"]))
    ledger = ledger.per_axis(devices=1, by_kind=True)
    return losses, jax.tree.map(np.asarray, state), starts, ledger, _mpi_fused.outstanding()


@pytest.mark.parametrize(
    "name, plan, which", PLANS.get(SIZE, []), ids=[p[0] for p in PLANS.get(SIZE, [])]
)
def test_prefetched_zero3_training_gives_the_same_bits(name, plan, which, policy):
    """Losses, every state block and the ledger bit for bit with the parameter gathers started
    ahead and without; the losses the XLA transport's."""
    chosen = policy if which == "policy" else which
    on_cfg, off_cfg = _config(plan, chosen, True), _config(plan, chosen, False)
    on_losses, on, starts, on_ledger, on_left = _train(on_cfg)
    off_losses, off, none, off_ledger, _ = _train(off_cfg)
    ref = h.xla_losses(on_cfg) if RANK == 0 else None
    ref = WORLD.bcast(ref, root=0)
    bad = []
    if not starts or none:
        bad.append(f"{name}: {starts} started calls in the program with overlap, {none} without")
    if [x.tobytes() for x in on_losses] != [x.tobytes() for x in off_losses]:
        bad.append(f"{name}: losses {on_losses} (prefetch) vs {off_losses}")
    if [x.tobytes() for x in on_losses] != [np.float32(x).tobytes() for x in ref]:
        bad.append(f"{name}: losses {on_losses} (MPI) vs {ref} (XLA)")
    for a, b in zip(jax.tree.leaves(on), jax.tree.leaves(off), strict=True):
        if not h.bits_equal(a, b):
            bad.append(f"{name}: a state block differs with prefetch")
            break
    if on_ledger != off_ledger:
        bad.append(f"{name}: ledger {on_ledger} (prefetch) vs {off_ledger}")
    if on_left:
        bad.append(f"{name}: {on_left} started calls never done")
    h.assert_on_every_rank(bad)
