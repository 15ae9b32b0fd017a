"""The MPI transport against the XLA transport, bit for bit. Run under mpirun (`make test` does):

    mpirun -np 4 --oversubscribe python -m pytest -p mpi_plugin -m mpi tests/test_mpi_transport.py

Each rank runs its shard with MpiTransport (one process per device); rank 0 also runs the same
per-shard function with `shard_map` on simulated host devices (the XLA transport) and broadcasts
that reference; every rank compares its own output block bitwise. Meshes whose device count differs
from the number of processes are skipped (so `-np 2` runs the 2-device meshes, `-np 4` the others).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import mpi_helpers as h
import numpy as np
import pytest
from _tiers import quick
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.mpi]

if h.mpi_ready():
    pytest.skip(h.mpi_ready(), allow_module_level=True)
if "OMPI_COMM_WORLD_SIZE" not in os.environ:  # importing mpi4py would MPI_Init this process
    pytest.skip("runs under mpirun (make test-mpi)", allow_module_level=True)

from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.partition import local_block  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def _need(shape):
    n = int(np.prod(shape))
    if n != SIZE:
        pytest.skip(f"mesh {shape} needs mpirun -np {n} (this job has {SIZE} processes)")


def _agree_on_failures(bad: list[str]) -> None:
    """Fail on every rank if any rank saw a mismatch (so no rank moves on alone)."""
    everyone = WORLD.allgather(bad)
    lines = [f"rank {r}: {k}" for r, ks in enumerate(everyone) for k in ks]
    assert not lines, "MPI results differ from XLA's:\n" + "\n".join(lines[:40])


def _full(shape, codec) -> bool:
    """Every axis choice for the plain collectives (and the identity codec up to 2-D meshes); the
    others run the five collectives over the last axis and the reversed tuple (compile time)."""
    return codec == "raw" or (codec == "none" and len(shape) < 3)


@functools.cache
def _steps(shape, kind, codec):
    """(XLA step on rank 0 else None, MPI launcher, MPI step, specs), compiled once per module."""
    mesh = h.mesh_shape(shape)
    axes = tuple(mesh)
    spec = P(axes)
    if kind == "collectives":
        body, out_specs = h.collectives_body(axes, h.CODECS[codec], full=_full(shape, codec)), spec
    elif kind == "error_feedback":
        body, out_specs = h.error_feedback_body(axes, h.CODECS[codec]), spec
    elif kind == "buckets":
        body, out_specs = h.buckets_body(axes, h.CODECS[codec]), spec
    else:
        grad = h.loss_body(axes, h.CODECS[codec])
        body, out_specs = (lambda x: {"grad": grad(x)}), {"grad": spec}
    xla = None
    if RANK == 0:
        xla = jaxhc.Launcher(mesh, "xla").shard_map(body, in_specs=spec, out_specs=out_specs)
    launcher = jaxhc.Launcher(mesh, "mpi")
    mpi = launcher.shard_map(body, in_specs=spec, out_specs=out_specs)
    return xla, launcher, mpi, spec, out_specs


def _compare(shape, kind, codec, x):
    """Run one program on both transports; each rank checks its block of XLA's result bitwise."""
    xla, launcher, mpi, spec, out_specs = _steps(shape, kind, codec)
    ref = h.Reference(lambda: {k: np.asarray(v) for k, v in xla(x).items()})
    got = mpi(launcher.put(x, spec))
    ref = ref.get()
    bad = []
    for k in sorted(ref):
        want = local_block(
            out_specs if not isinstance(out_specs, dict) else out_specs[k],
            ref[k],
            launcher.grid.coords,
            launcher.mesh_shape,
        )
        if not h.bits_equal(got[k], want):
            mine = np.asarray(got[k])
            bad.append(
                f"{k}: got {mine.dtype}{list(mine.shape)}, want {want.dtype}{list(want.shape)}"
            )
    _agree_on_failures(bad)


# Meshes per codec: the plain and identity paths everywhere; mpc and zfp on every mesh the issue
# names; the budgeted mpc and the test-only `finite` codec (agreement + cond, usable before the
# native codecs land) on fewer, to bound compile time. NaN fallbacks reuse the compiled programs.
_ALL = list(h.MESHES)
MESHES_OF = {
    "raw": _ALL,
    "none": _ALL,
    "finite": [(2,), (1, 2, 2)],
    "mpc": [(2,), (4,), (2, 2), (1, 2, 2)],
    "mpc0.9": [(2,), (2, 2)],
    "zfp8": [(2,), (4,), (2, 2), (1, 2, 2)],
    "q8": [(2,), (2, 2)],
    "q8sr": [(2,)],
}


def _cases(codecs):
    return [
        pytest.param(shape, codec, id=f"{h.mesh_id(shape)}-{codec}")
        for shape in h.MESHES
        for codec in codecs
        if shape in MESHES_OF[codec]
    ]


# The quick suite: each codec on one mesh of 4 ranks (and of 2); every mesh under `slow`.
QUICK_COLLECTIVES = {"2-none", "2x2-none", "1x2x2-mpc", "2x2-zfp8", "2x2-q8", "2-q8sr", "2-finite"}


@pytest.mark.parametrize(("shape", "codec"), quick(_cases(h.CODECS), QUICK_COLLECTIVES))
def test_collectives_match_xla(shape, codec):
    _need(shape)
    _compare(shape, "collectives", codec, h.global_input(shape))


@pytest.mark.parametrize(("shape", "codec"), _cases(["finite", "mpc0.9", "zfp8", "q8", "q8sr"]))
def test_fallback_agreed_across_ranks(shape, codec):
    """A NaN on the last rank only: every rank takes the raw branch (no deadlock), as XLA does."""
    _need(shape)
    _compare(shape, "collectives", codec, h.global_input(shape, nan_at=SIZE - 1))


@pytest.mark.parametrize(
    ("shape", "codec"), [((2,), "zfp8"), ((4,), "zfp8"), ((2, 2), "zfp8"), ((2,), "raw")]
)
@pytest.mark.parametrize("nan", [False, True])
def test_error_feedback_matches_xla(shape, codec, nan):
    """psum / psum_scatter with residuals take the unfused algorithm over MPI: XLA's bits, the
    residuals included, also when a NaN on the last rank sends everyone down the raw path."""
    _need(shape)
    x = h.global_input(shape, nan_at=SIZE - 1 if nan else None)
    _compare(shape, "error_feedback", codec, x)


@pytest.mark.parametrize(
    ("shape", "codec"),
    [((2,), c) for c in ("raw", "mpc", "zfp8", "q8", "q8sr")] + [((2, 2), "zfp8"), ((4,), "mpc")],
    ids=lambda v: h.mesh_id(v) if isinstance(v, tuple) else v,
)
@pytest.mark.parametrize("nan", [False, True])
def test_pytree_buckets_match_xla(shape, codec, nan):
    """A pytree psum sent in buckets (the fused MPI psum for mpc / zfp / q8, the unfused algorithm
    for q8:sr) gives XLA's bits, also when a NaN on the last rank sends its bucket down the raw
    path."""
    _need(shape)
    _compare(shape, "buckets", codec, h.global_input(shape, nan_at=SIZE - 1 if nan else None))


@pytest.mark.parametrize(
    ("shape", "codec"),
    quick(
        [(s, c) for s in [(2,), (1, 2), (4,), (2, 2), (1, 2, 2)] for c in ("raw", "none")]
        + [((2,), "finite")],
        {((2,), "raw"), ((2, 2), "raw"), ((1, 2, 2), "none")},
    ),
    ids=lambda v: h.mesh_id(v) if isinstance(v, tuple) else v,
)
def test_gradients_match_xla(shape, codec):
    """jax.grad through every collective: MPI gives shard_map(check_vma=False)'s gradients."""
    _need(shape)
    _compare(shape, "grad", codec, h.global_input(shape, rows=4, cols=16, seed=1))


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=h.mesh_id)
def test_raw_dtypes_match_lax(shape):
    """Plain collectives on bf16 / f16 / f32 / int32 data: MPI == jax.lax on host devices."""
    _need(shape)
    mesh = h.mesh_shape(shape)
    spec = P(tuple(mesh))
    x = h.global_input(shape, rows=4, cols=8, seed=2)
    xs = {
        "f32": x,
        "bf16": x.astype(ml_dtypes.bfloat16),
        "f16": np.clip(x, -60000, 60000).astype(np.float16),
        "i32": (x * 1000).astype(np.int32),
    }
    ref = h.Reference(
        lambda: jaxhc.Launcher(mesh, "xla").run(
            h.raw_body(tuple(mesh), jax.lax), xs, in_specs=spec, out_specs=spec, fetch=True
        )
    )
    got = jaxhc.Launcher(mesh, "mpi").run(
        h.raw_body(tuple(mesh)), xs, in_specs=spec, out_specs=spec
    )
    ref = ref.get()
    bad = [k for k in sorted(ref) if not h.bits_equal(got[k], ref[k][RANK : RANK + 1])]
    _agree_on_failures(bad)


@pytest.mark.parametrize("shape", [(2,), (1, 2), (2, 2), (1, 2, 2)], ids=h.mesh_id)
def test_put_fetch_roundtrip(shape):
    _need(shape)
    mesh = h.mesh_shape(shape)
    names = tuple(mesh)
    x = np.arange(8 * 8 * 4, dtype=np.float32).reshape(8, 8, 4)
    specs = [P(), P(names[0]), P(None, names[-1]), P(tuple(reversed(names)), None), P(None, names)]
    launcher = jaxhc.Launcher(mesh, "mpi")
    for spec in specs:
        back = launcher.fetch(launcher.put(x, spec), spec)
        assert h.bits_equal(back, x), spec


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=h.mesh_id)
def test_axis_index_and_size(shape):
    _need(shape)
    mesh = h.mesh_shape(shape)
    names = tuple(mesh)

    def body(x):
        out = {}
        for ax in h.axis_choices(names):
            k = ax if isinstance(ax, str) else "+".join(ax)
            out[k] = (x * 0 + jaxhc.axis_index(ax) * 100 + jaxhc.axis_size(ax)).astype(np.int32)
        return out

    spec = P(names)
    x = np.zeros((SIZE,), np.int32)
    ref = jaxhc.run(
        body, x, mesh_shape=mesh, in_specs=spec, out_specs=spec, transport="xla", fetch=True
    )
    got = jaxhc.run(
        body, x, mesh_shape=mesh, in_specs=spec, out_specs=spec, transport="mpi", fetch=True
    )
    assert all(h.bits_equal(got[k], ref[k]) for k in ref)


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=h.mesh_id)
def test_allreduce_psum_mode(shape):
    """psum="allreduce" (MPI_Allreduce): integers exact, floats equal up to summation order."""
    _need(shape)
    mesh = h.mesh_shape(shape)
    spec = P(tuple(mesh))
    x = h.global_input(shape, rows=2, cols=8, seed=3)
    xs = {"f32": x, "i32": (x * 1000).astype(np.int32), "bf16": x.astype(ml_dtypes.bfloat16)}

    def body(xs):
        return {k: jaxhc.psum(v, tuple(mesh))[None] for k, v in xs.items()}

    launcher = jaxhc.Launcher(mesh, "mpi", psum="allreduce")
    got = launcher.fetch(launcher.run(body, xs, in_specs=spec, out_specs=spec), spec)
    want = {k: v.reshape(SIZE, 2, 8).astype(np.float64).sum(0) for k, v in xs.items()}
    for r in range(SIZE):
        assert h.bits_equal(got["i32"][r], xs["i32"].reshape(SIZE, 2, 8).sum(0).astype(np.int32))
        np.testing.assert_allclose(got["f32"][r], want["f32"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            got["bf16"][r].astype(np.float32), want["bf16"], rtol=2e-2, atol=1e-2
        )


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=h.mesh_id)
def test_scan_remat_and_cond_match_xla(shape):
    """Collectives inside lax.scan, jax.checkpoint (recomputed in the backward pass) and a
    rank-agreed lax.cond with a collective in each branch: mpi4jax's ordered token must not
    deadlock or reorder, and results match XLA bitwise."""
    _need(shape)
    mesh = h.mesh_shape(shape)
    ax = tuple(mesh)

    def body(x):
        def step(c, _):
            return c + 0.5 * jaxhc.psum(c, ax), None

        y, _ = jax.lax.scan(step, x, None, length=3)
        block = jax.checkpoint(lambda v: jnp.sin(jaxhc.psum(v, ax, codec="none")))
        g = jax.grad(lambda v: block(v).sum())(x)
        big = jaxhc.psum(jnp.max(jnp.abs(x)), ax) > 10.0  # the same on every rank
        z = jax.lax.cond(
            big,
            lambda v: jaxhc.all_gather(v, ax, axis=1, tiled=True),
            lambda v: jnp.tile(jaxhc.ppermute(v, ax, [(0, 1)]), (1, SIZE)),
            x,
        )
        return {"y": y[None], "g": g[None], "z": z[None]}

    spec = P(ax)
    x = h.global_input(shape, rows=2, cols=4, seed=4)
    ref = h.Reference(
        lambda: jaxhc.run(
            body, x, mesh_shape=mesh, in_specs=spec, out_specs=spec, transport="xla", fetch=True
        )
    )
    got = jaxhc.run(body, x, mesh_shape=mesh, in_specs=spec, out_specs=spec, transport="mpi")
    ref = ref.get()
    _agree_on_failures(
        [k for k in sorted(ref) if not h.bits_equal(got[k], ref[k][RANK : RANK + 1])]
    )
