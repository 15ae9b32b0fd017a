"""What jax.lax users expect of the collectives beyond arrays in, arrays out: Python scalars and
0-d arrays, forward-mode differentiation, pmean, and a ppermute vote among senders only."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxhc
from tests._mesh import mesh_of, run
from tests.test_collectives import _zfp_tolerance, collectives, integer_data, smooth_data

CODECS = [None, "none", "mpc", "zfp:8"]


def per_rank(fn, mesh):
    """Run `fn()` (no inputs) on every rank of `mesh`; each output gets a leading rank dim."""
    spec = jax.P(tuple(mesh.axis_names))

    def body():
        return jax.tree.map(lambda v: jnp.asarray(v)[None], fn())

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(), out_specs=spec))()


def assert_matches(got, want, codec, terms=1):
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if codec and codec.startswith("zfp"):
        atol = _zfp_tolerance(want, int(codec.split(":")[1]), terms)
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def test_python_scalars_fold_as_in_lax():
    """`psum(1, axis)` is the rank-count idiom: a trace-time Python number, as jax.lax gives."""
    mesh, axis = mesh_of("1d4")
    seen = {}

    def fn():
        for value in (1, 2.5):
            seen[value] = (
                jaxhc.psum(value, axis, codec="zfp:8"),
                lax.psum(value, axis),
                jaxhc.pmean(value, axis),
                lax.pmean(value, axis),
            )
        return jnp.zeros(())

    per_rank(fn, mesh)
    for ours, ref, ours_mean, ref_mean in seen.values():
        assert type(ours) is type(ref) and ours == ref
        assert type(ours_mean) is type(ref_mean) and ours_mean == ref_mean


@pytest.mark.parametrize("codec", CODECS)
def test_scalars_and_0d_arrays_match_lax(codec):
    mesh, axis = mesh_of("1d4")
    swap = [(0, 1), (1, 0), (2, 3)]  # rank 3 receives nothing: zeros, as lax gives
    values = {
        "int": 3,
        "float": 1.5,
        "bool": True,
        "f32": jnp.float32(2.25),
        "bf16": jnp.asarray(3.0, jnp.bfloat16),
        "i32": jnp.int32(-2),
    }

    def both(value):
        r = (lax.axis_index(axis) + 1).astype(jnp.asarray(value).dtype)
        v = value * r if not isinstance(value, bool) else value  # differs per rank
        pairs = {
            "psum": (jaxhc.psum(v, axis, codec=codec), lax.psum(v, axis)),
            "pmean": (jaxhc.pmean(v, axis, codec=codec), lax.pmean(v, axis)),
            "all_gather": (jaxhc.all_gather(v, axis, codec=codec), lax.all_gather(v, axis)),
            "ppermute": (jaxhc.ppermute(v, axis, swap, codec=codec), lax.ppermute(v, axis, swap)),
        }
        return {k: (jnp.asarray(a), jnp.asarray(b)) for k, (a, b) in pairs.items()}

    got = per_rank(lambda: {name: both(v) for name, v in values.items()}, mesh)
    for name, results in got.items():
        for op, (ours, ref) in results.items():
            terms = 4 if op in ("psum", "pmean") else 1
            lossy = codec if jnp.issubdtype(ref.dtype, jnp.floating) else None
            assert_matches(ours, ref, lossy, terms), (name, op)


@pytest.mark.parametrize("op", ["psum_scatter", "all_to_all"])
def test_0d_input_to_a_splitting_collective_is_a_one_line_error(op):
    mesh, axis = mesh_of("1d4")
    call = {
        "psum_scatter": lambda v: jaxhc.psum_scatter(v, axis, codec="zfp:8"),
        "all_to_all": lambda v: jaxhc.all_to_all(v, axis, 0, 0, codec="zfp:8"),
    }[op]
    with pytest.raises(ValueError, match=r"out of range for shape \(\)"):
        per_rank(lambda: call(jnp.float32(1.0)), mesh)


JVP_NAMES = ["psum", "all_gather_tiled", "psum_scatter", "ppermute_partial", "all_to_all"]


@pytest.mark.parametrize("name", JVP_NAMES)
@pytest.mark.parametrize("codec", [None, "mpc", "zfp:16"])
def test_jvp_and_linearize_match_lax(name, codec):
    """Forward mode: the tangent travels like the primal (compressed), exact for plain / mpc (the
    identity codec's path is mpc's without the budget)."""
    mesh, axis = mesh_of("3d-data-pipe")
    parts = 4
    ours, ref = collectives(axis, parts)[name]
    x, t = smooth_data(mesh), integer_data(mesh, jnp.float32, seed=3) / 8

    def forward(f):
        def body(a, u):
            y, dy = jax.jvp(f, (a,), (u,))
            _, lin = jax.linearize(f, a)
            return y, dy, lin(2 * u)

        return run(body, mesh, x, t)

    with jaxhc.accounting.Ledger() as ledger:
        got = jax.block_until_ready(forward(lambda a: ours(a, codec=codec)))
    want = forward(ref)
    terms = parts + 1 if name.startswith("psum") else 1
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w, codec, terms)
    traffic = ledger.per_axis(devices=8)[",".join(axis)]
    assert traffic["calls"] == 4  # the jvp's primal and tangent, linearize's primal and tangent
    if codec == "zfp:16":
        assert traffic["wire_bytes"] < 0.6 * traffic["raw_bytes"]  # the tangents too


def test_reverse_of_forward_mode_is_the_conjugate_collective():
    """`jax.linear_transpose` of the linearized compressed all_gather is a compressed
    psum_scatter; equal to lax for the identity codec."""
    mesh, axis = mesh_of("1d4")
    x = integer_data(mesh, jnp.float32)

    def body(a, fn):
        _, lin = jax.linearize(fn, a)
        (back,) = jax.linear_transpose(lin, a)(fn(a))
        return back

    ours = run(lambda a: body(a, lambda v: jaxhc.all_gather(v, axis, codec="none")), mesh, x)
    ref = run(lambda a: body(a, lambda v: lax.all_gather(v, axis)), mesh, x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))


@pytest.mark.parametrize("codec", ["none", "mpc", "zfp:8"])
def test_pmean_matches_lax(codec):
    mesh, axis = mesh_of("1d4")
    x = integer_data(mesh, jnp.float32)
    got = run(lambda a: jaxhc.pmean(a, axis, codec=codec), mesh, x)
    want = run(lambda a: lax.pmean(a, axis), mesh, x)
    assert_matches(got, want, codec, terms=5)
    xi = integer_data(mesh, jnp.int32)  # integers give floats, as in lax
    got = run(lambda a: jaxhc.pmean(a, axis, codec=codec), mesh, xi)
    assert_matches(got, run(lambda a: lax.pmean(a, axis), mesh, xi), None)


@pytest.mark.parametrize("garbage_on, fallbacks", [(3, 0.0), (2, 1.0)])
def test_ppermute_vote_is_among_senders_only(garbage_on, fallbacks):
    """Rank 3 sends nothing (a pipeline's last stage): NaNs there cannot force the raw path on
    the others; on a sending rank they must."""
    mesh, axis = mesh_of("1d4")
    chain = [(0, 1), (1, 2), (2, 3)]
    x = np.asarray(smooth_data(mesh)).copy()
    x[garbage_on] = np.nan
    x = jnp.asarray(x)
    with jaxhc.accounting.Ledger() as ledger:
        got = run(lambda a: jaxhc.ppermute(a, axis, chain, codec="zfp:8"), mesh, x)
        jax.block_until_ready(got)
    want = run(lambda a: lax.ppermute(a, axis, chain), mesh, x)
    assert ledger.per_axis(devices=4)[axis]["fallbacks"] == fallbacks
    if fallbacks:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    else:
        assert np.isfinite(np.asarray(got)).all()
        assert_matches(got, want, "zfp:8")
