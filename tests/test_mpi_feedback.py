"""The fused MPI psum_scatter with error feedback (ffi/mpi: jaxhc_mpi_psum_scatter_ef; gradient
reduce-scatters, ``kind="grad"``) against the XLA transport's unfused algorithm, bit for bit,
under mpirun.

The native call adds the residual, encodes, sends, and writes the new residual from each
segment's decoded values while the wire runs; here segments are small so every case spans many,
with partial chunks and blocks, over the codecs the engine fuses, a scatter along dimension 1,
and the fallbacks: a NaN (or, rotated, a value too large to code) on the last rank sends every
rank plain, where the residual keeps nothing. Rank 0 computes the reference with the XLA
transport on simulated devices; every rank checks its reduced block and its new residual
bitwise, and that the fused call ran.
"""

from __future__ import annotations

import functools

import jax
import mpi_helpers as h
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.mpi]

h.skip_unless_fused_under_mpirun()

from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.partition import local_block  # noqa: E402
from jaxhc.transport import _mpi_fused  # noqa: E402

WORLD = MPI.COMM_WORLD
SIZE = WORLD.Get_size()
TARGET = "jaxhc_mpi_psum_scatter_ef"


def _body(codec, dim):
    def body(x, old):
        out, new = jaxhc.psum_scatter(
            x, "x", scatter_dimension=dim, tiled=True, codec=codec, kind="grad", residual=old
        )
        return {"out": out, "residual": new}

    return body


@functools.cache
def _programs(codec, dim):
    body = _body(codec, dim)
    spec = P("x")
    specs = {"out": spec, "residual": spec}
    ins = (spec, spec)
    xla = jaxhc.Launcher({"x": SIZE}, "xla").shard_map(body, in_specs=ins, out_specs=specs)
    launcher = jaxhc.Launcher({"x": SIZE}, "mpi")
    return xla, launcher, launcher.shard_map(body, in_specs=ins, out_specs=specs), body


def _input(rows, cols, case):
    """(values, an old residual with values of its own in every block). The residual is an input
    of the program, as the train state's is: XLA:CPU contracts a product into the add that
    carries it (an FMA) when it computes both in one fusion, which rounds differently."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((SIZE * rows, cols)).astype(np.float32)
    x *= np.geomspace(1e-3, 1e3, cols, dtype=np.float32)
    old = (0.01 * np.sin(x)).astype(np.float32)
    if case == "nan":
        x[-1, -1] = np.nan
    if case == "huge":  # finite, but past what a rotated quantizer codes (2^116)
        x[-1, -1] = 1e36
    return x, old


def _check(codec, rows, cols, dim=0, case="plain"):
    x, old = _input(rows, cols, case)
    xla, launcher, mpi, body = _programs(codec, dim)
    ref = h.Reference(lambda: {k: np.asarray(v) for k, v in xla(x, old).items()})
    xin, rin = launcher.put(x, P("x")), launcher.put(old, P("x"))
    with jaxhc.transport.use(launcher.transport):
        hlo = jax.jit(body).lower(xin, rin).as_text()
    got = jax.block_until_ready(mpi(xin, rin))
    ref = ref.get()
    bad = [] if TARGET in hlo else [f"{codec}: the fused call {TARGET} did not run"]
    for k in sorted(ref):
        want = local_block(P("x"), ref[k], launcher.grid.coords, launcher.mesh_shape)
        if not h.bits_equal(got[k], want):
            g, w = np.asarray(got[k]), np.asarray(want)
            diff = int(np.sum(g.view(np.uint8) != w.view(np.uint8))) if g.shape == w.shape else -1
            where = np.argwhere(g != w)[:3].tolist() if g.shape == w.shape else []
            bad.append(
                f"{codec} {rows}x{cols} dim {dim} {case} {k}: {diff} bytes differ, at {where}: "
                + " ".join(f"{g[tuple(i)]!r} vs {w[tuple(i)]!r}" for i in where)
            )
    everyone = WORLD.allgather(bad)
    lines = [f"rank {r}: {k}" for r, ks in enumerate(everyone) for k in ks]
    assert not lines, "\n".join(lines)


@pytest.fixture(autouse=True)
def _small_segments(monkeypatch):
    monkeypatch.setattr(_mpi_fused, "SEGMENT_BYTES", 4096)  # many segments per chunk
    _programs.cache_clear()


CODECS = ["q4:h", "q8", "q4:b64", "zfp:8", "zfp:8:d3", "mpc"]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shape", [(1, 7), (3, 339), (8, 1000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_feedback_matches_xla(codec, shape):
    _check(codec, SIZE * shape[0], shape[1])


@pytest.mark.parametrize("codec", ["q4:h", "zfp:8"])
def test_feedback_along_dimension_1(codec):
    _check(codec, 3, SIZE * 500, dim=1)


@pytest.mark.parametrize(("codec", "case"), [("q4:h", "nan"), ("zfp:8", "nan"), ("q8:h", "huge")])
def test_feedback_fallback_sends_the_carried_values_plain(codec, case):
    _check(codec, SIZE * 8, 1000, case=case)
