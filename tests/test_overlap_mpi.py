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
MPI, SIZE, LAYERS = s.MPI, s.SIZE, s.LAYERS


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
    specs = dict(in_specs=(P(None, "x"), P("x")), out_specs=(P(None, "x"), P("x"), P("x")))
    return s.programs(*_bodies(codec), specs)


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
    ref = h.Reference(lambda: jax.tree.map(np.asarray, xla(rows, v)))
    args = (launcher.put(rows, P(None, "x")), launcher.put(v, P("x")))
    got, want, on, off = s.run_both(overlapped, sync, *args)
    ref = ref.get()
    with jaxhc.transport.use(launcher.transport):
        hlo = jax.jit(overlapped).lower(*args).as_text()
    specs = (P(None, "x"), P("x"), P("x"))
    names = ("scatter", "psum", "side")
    bad = s.mismatches(f"{codec} {case}", launcher, names, got, want, ref, specs)
    if hlo.count("jaxhc_mpi_start") != 2 or hlo.count("jaxhc_mpi_done") != 2:
        bad.append(f"{codec}: {hlo.count('jaxhc_mpi_start')} starts in the program, not 2")
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


def _config(policy: str, overlap: bool):
    """`jaxhc train --transport mpi`'s config of a data = SIZE mesh."""
    from jaxhc.train.config import load

    return load(
        str(s.CONFIG),
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


@pytest.mark.skipif(SIZE != 2, reason="-np 2 only (make test-mpi): 4 ranks compile 2x slower")
@pytest.mark.parametrize("policy", ["zhybrid", "qhybrid"])
def test_overlapped_training_gives_the_same_bits(policy):
    """Losses and every state block bit for bit with the layers' reductions started in the
    backward and without, and the losses the XLA transport's."""
    cfg = _config(policy, True)
    ref = h.Reference(lambda: h.xla_losses(cfg))
    on, off = s.train(cfg), s.train(_config(policy, False))
    ref = ref.get()
    bad = []
    starts, none = on[2], off[2]
    if starts != 1 or none != 0:  # one in the layer scan's backward
        bad.append(f"{policy}: {starts} started reductions with overlap, {none} without")
    bad += s.same_training(policy, "overlap", on, off, ref)
    h.assert_on_every_rank(bad)


# q4_ef with every message compressed (the tiny model's are under the presets' min_bytes).
FEEDBACK = """\
name: q4-ef-every-message
min_bytes: 0
axes:
  data: {codec: q4:h, error_feedback: true, param: q8}
"""


@pytest.mark.skipif(SIZE != 2, reason="-np 2 only (make test-mpi): 4 ranks compile 2x slower")
def test_overlapped_training_with_error_feedback_gives_the_same_bits(tmp_path_factory):
    """Error feedback: each layer's reduce-scatter started in the backward with its part of the
    residual (the fused call that adds it, codes, and keeps what the codec lost), finished after
    it; losses and every state block, the residuals among them, bit for bit as without overlap
    and the losses the XLA transport's."""
    policy = s.policy_file(tmp_path_factory, "q4-ef.yaml", FEEDBACK)
    cfg = _config(policy, True)
    ref = h.Reference(lambda: h.xla_losses(cfg))
    on, off = s.train(cfg), s.train(_config(policy, False))
    ref = ref.get()
    bad = []
    if on[2] != 1 or off[2] != 0:
        bad.append(f"q4_ef: {on[2]} started reductions with overlap, {off[2]} without")
    if not on[1].opt_state["residual"].any():
        bad.append("q4_ef: no residual kept")
    bad += s.same_training("q4_ef", "overlap", on, off, ref)
    h.assert_on_every_rank(bad)
