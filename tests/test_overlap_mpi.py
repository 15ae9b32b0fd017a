"""Collectives started and finished later on the MPI transport (`jaxhc.collectives.started`, the
engine's progress threads: ffi/mpi/queue.h), under mpirun, against the synchronous calls and the
XLA transport, bit for bit; and the train step with its per-layer gradient reductions started in
the backward (``train.overlap``) against the same step without them.

Several calls are in flight at once (started in a scan, finished in another), with compute and a
synchronous call on another communicator in between; a NaN on one rank sends a started zfp (or q8)
call plain on every rank (its agreement runs on the progress thread's own communicator).
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


def test_progress_threads_are_on():
    """mpi4py initialises MPI with MPI_THREAD_MULTIPLE: the started calls run on the progress
    threads here (else every test below would pass without anything overlapping)."""
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
    assert _mpi_fused.async_ready()


def _bodies(codec):
    """(started, synchronous) per-shard programs of the same reductions: a psum_scatter of each
    of LAYERS rows started in one scan and finished in another, a psum started before them and
    finished after, with compute and a synchronous psum over ("x", "y") in between."""

    def sync(rows, v):
        scattered = lax.map(lambda r: jaxhc.psum_scatter(r, "x", tiled=True, codec=codec), rows)
        side = jaxhc.psum(jnp.sin(v), ("x", "y"))
        return scattered, jaxhc.psum(v * 2.0, "x", codec=codec), side

    def overlapped(rows, v):
        total = started.psum_start(v * 2.0, "x", codec=codec)
        call = {}

        def begin(_, r):
            call["s"] = started.psum_scatter_start(r * 1.0, "x", codec=codec)
            return None, call["s"].handle

        handles = lax.scan(begin, None, rows)[1]
        side = jaxhc.psum(jnp.sin(v), ("x", "y"))  # the calling thread's, meanwhile
        scattered = lax.scan(
            lambda _, hd: (None, started.psum_scatter_done(call["s"].like(hd))), None, handles
        )[1]
        return scattered, started.psum_done(total), side

    return overlapped, sync


@functools.cache
def _programs(codec):
    launcher = jaxhc.Launcher({"x": SIZE, "y": 1}, "mpi")
    overlapped, sync = _bodies(codec)
    specs = dict(in_specs=(P(None, "x"), P("x")), out_specs=(P(None, "x"), P("x"), P("x")))
    xla = jaxhc.Launcher({"x": SIZE, "y": 1}, "xla").shard_map(sync, **specs)
    return launcher, launcher.shard_map(overlapped, **specs), launcher.shard_map(sync, **specs), xla


def _inputs(case):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((LAYERS, SIZE * SIZE * 4100)).astype(np.float32)
    rows *= np.geomspace(1e-3, 1e3, rows.shape[1], dtype=np.float32)
    v = rng.standard_normal(SIZE * 3001).astype(np.float32)
    if case == "nan":  # the last rank's part of the middle row
        rows[1, -1] = np.nan
    return rows, v


@pytest.mark.parametrize(
    "codec, case",
    [(None, "plain"), ("zfp:8", "plain"), ("mpc", "plain"), ("zfp:8", "nan")]
    + [("q8", "plain"), ("q8:h", "plain"), ("q4:h", "plain"), ("q8", "nan")],
)
def test_started_calls_match_the_synchronous_ones(codec, case):
    rows, v = _inputs(case)
    launcher, overlapped, sync, xla = _programs(codec)
    ref = None
    if RANK == 0:
        ref = jax.tree.map(np.asarray, xla(rows, v))
    ref = WORLD.bcast(ref, root=0)
    args = (launcher.put(rows, P(None, "x")), launcher.put(v, P("x")))
    with jaxhc.accounting.Ledger() as on_ledger:
        got = jax.block_until_ready(overlapped(*args))
    with jaxhc.accounting.Ledger() as off_ledger:
        want = jax.block_until_ready(sync(*args))
    with jaxhc.transport.use(launcher.transport):
        hlo = jax.jit(overlapped).lower(*args).as_text()
    bad = []
    specs = (P(None, "x"), P("x"), P("x"))
    for name, g, w, r, spec in zip(("scatter", "psum", "side"), got, want, ref, specs, strict=True):
        if not h.bits_equal(g, w):
            bad.append(f"{codec} {case} {name}: started != synchronous")
        if not h.bits_equal(g, local_block(spec, r, launcher.grid.coords, launcher.mesh_shape)):
            bad.append(f"{codec} {case} {name}: MPI != XLA")
    if hlo.count("jaxhc_mpi_start") != 2 or hlo.count("jaxhc_mpi_done") != 2:
        bad.append(f"{codec}: {hlo.count('jaxhc_mpi_start')} starts in the program, not 2")
    on, off = on_ledger.per_axis(devices=1)["x"], off_ledger.per_axis(devices=1)["x"]
    if on != off:
        bad.append(f"{codec} {case}: ledger {on} != {off}")
    if case == "nan" and not on["fallbacks"]:
        bad.append("the NaN did not send the started call plain")
    h.assert_on_every_rank(bad)


def test_without_progress_threads_a_start_runs_the_call_itself(monkeypatch):
    """JAXHC_MPI_ASYNC=0: `can_start` says no (the step keeps its synchronous calls), and the
    engine's start, called anyway, runs the call on the spot; done gives the same values."""
    launcher, *_ = _programs("zfp:8")
    rows, _ = _inputs("plain")
    x = launcher.put(rows[0], P("x"))
    comm = launcher.grid.async_comm("x")
    codec = jaxhc.codecs.parse("zfp:8")

    def both(x):
        handle = _mpi_fused.start("psum_scatter", x, comm, codec)
        return _mpi_fused.done(handle, x.size // SIZE, x.dtype)[0], _mpi_fused.psum_scatter(
            x, launcher.grid.comm("x"), codec
        )[0]

    monkeypatch.setenv("JAXHC_MPI_ASYNC", "0")
    assert not _mpi_fused.async_ready()
    with jaxhc.transport.use(launcher.transport):
        assert not started.can_start(x, "x", codec=codec)
    got, want = jax.jit(both)(x)
    h.assert_on_every_rank([] if h.bits_equal(got, want) else ["inline start != synchronous call"])


def test_can_start_only_what_the_engine_runs():
    launcher, *_ = _programs(None)
    like = jax.ShapeDtypeStruct((SIZE * 8,), jnp.float32)
    with jaxhc.transport.use(launcher.transport):
        for codec in ("zfp:8", "mpc", "q8", "q4", "q8:h", "q4:h"):
            assert started.can_start(like, "x", codec=codec), codec
        assert started.can_start(jax.ShapeDtypeStruct(like.shape, jnp.bfloat16), "x", codec="q8")
        assert not started.can_start(like, "y", codec="zfp:8")  # one rank: nothing to move
        assert not started.can_start(like, "x", codec="q8:sr")  # not fused on MPI
        assert not started.can_start(jax.ShapeDtypeStruct(like.shape, jnp.float16), "x", codec="q8")
        with pytest.raises(ValueError, match="cannot be started"):
            started.psum_scatter_start(jnp.zeros(SIZE * 8), "x", codec="q8:sr")
    assert not started.can_start(like, "x", codec="zfp:8")  # the XLA transport


# --- the train step ------------------------------------------------------------------------------

TINY = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.block_size=16",
    "train.batch_size=8",
]


def _train(policy: str, overlap: bool, steps: int = 2):
    """(losses, this rank's state blocks) after `steps` of `jaxhc train --transport mpi`'s step
    on a data = SIZE mesh."""
    from jaxhc.parallel import per_shard_train_step
    from jaxhc.train.config import load
    from jaxhc.train.mpi import MpiRunner

    cfg = load(
        str(CONFIG),
        TINY
        + [
            f"compression={policy}",
            "transport=mpi",
            f"mesh.data={SIZE}",
            "mesh.tensor=1",
            "mesh.pipe=1",
            "mesh.microbatches=1",
            f"train.overlap={str(overlap).lower()}",
        ],
    )
    runner = MpiRunner(cfg)
    state = runner.init_state()
    step = per_shard_train_step(cfg.model, cfg.mesh, cfg.optim, cfg.policy, 0, overlap)
    rows = runner.launcher.put(np.zeros((8, 17), np.int32), runner.rows)
    with jaxhc.transport.use(runner.launcher.transport):
        starts = str(jax.make_jaxpr(step)(state, rows)).count("jaxhc_mpi_start")
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        tokens = rng.integers(0, cfg.model.vocab_size, (8, 17), dtype=np.int32)
        state, metrics = runner.step(state, tokens)
        losses.append(np.float32(metrics["loss"]))
    return cfg, losses, jax.tree.map(np.asarray, state), starts


@pytest.mark.skipif(SIZE != 2, reason="-np 2 only (make test-mpi): 4 ranks compile 2x slower")
@pytest.mark.parametrize("policy", ["zhybrid", "qhybrid"])
def test_overlapped_training_gives_the_same_bits(policy):
    """Losses and every state block bit for bit with the layers' reductions started in the
    backward and without, and the losses the XLA transport's."""
    cfg, on_losses, on, starts = _train(policy, True)
    _, off_losses, off, none = _train(policy, False)
    ref = h.xla_losses(cfg) if RANK == 0 else None
    ref = WORLD.bcast(ref, root=0)
    bad = []
    if starts != 1 or none != 0:  # one in the layer scan's backward
        bad.append(f"{policy}: {starts} started reductions with overlap, {none} without")
    if [x.tobytes() for x in on_losses] != [x.tobytes() for x in off_losses]:
        bad.append(f"{policy}: losses {on_losses} (overlap) vs {off_losses}")
    if [x.tobytes() for x in on_losses] != [np.float32(x).tobytes() for x in ref]:
        bad.append(f"{policy}: losses {on_losses} (MPI) vs {ref} (XLA)")
    for a, b in zip(jax.tree.leaves(on), jax.tree.leaves(off), strict=True):
        if not h.bits_equal(a, b):
            bad.append(f"{policy}: a state block differs with overlap")
            break
    h.assert_on_every_rank(bad)
