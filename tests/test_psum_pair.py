"""jaxhc.psum_pair: the sum over two ranks of an axis, against jax.lax and the codecs themselves."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxhc
from jaxhc.codecs import parse
from tests._mesh import mesh_of, run

SHAPE = (16, 12)  # per-shard block after the leading device dim


def data(parts: int, seed: int = 0, integer: bool = False) -> jax.Array:
    rng = np.random.default_rng(seed)
    if integer:
        return jnp.asarray(rng.integers(-8, 9, size=(parts, *SHAPE)), jnp.float32)
    t = np.linspace(0, 6, parts * np.prod(SHAPE)).reshape((parts, *SHAPE))
    return jnp.asarray(np.sin(t) + 0.01 * rng.standard_normal(t.shape), jnp.float32)


@pytest.mark.parametrize("mesh_name,pair", [("1d2", (0, 1)), ("1d4", (0, 3)), ("1d8", (5, 2))])
@pytest.mark.parametrize("codec", ["none", "mpc", "mpc:0.3"])
def test_lossless_pair_sum_is_the_pairs_sum(mesh_name, pair, codec):
    """On the pair: x_a + x_b (exact: small integers); elsewhere x itself."""
    mesh, axis = mesh_of(mesh_name)
    parts = mesh.devices.size
    x = np.asarray(data(parts, integer=True))
    got = np.asarray(
        run(lambda a: jaxhc.psum_pair(a, axis, pair, codec=codec), mesh, jnp.asarray(x))
    )
    want = x.copy()
    want[pair[0]] = want[pair[1]] = x[pair[0]] + x[pair[1]]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("codec", ["zfp:8", "zfp:16:d2", "q8"])
def test_lossy_pair_sum_adds_what_each_end_decodes(codec):
    """Both ends hold decode(encode(x_a)) + decode(encode(x_b)), bit for bit; the others x."""
    mesh, axis = mesh_of("1d4")
    a, b = 3, 1
    x = data(4)
    got = np.asarray(run(lambda v: jaxhc.psum_pair(v, axis, (a, b), codec=codec), mesh, x))
    c = parse(codec)
    seen = [c.decode(c.encode(x[r]).payload, SHAPE, jnp.float32) for r in (a, b)]
    want = np.asarray(seen[0] + seen[1])
    np.testing.assert_array_equal(got[a], want)
    np.testing.assert_array_equal(got[b], want)
    assert not np.array_equal(want, np.asarray(x[a] + x[b]))  # the codec is lossy here
    for r in (0, 2):
        np.testing.assert_array_equal(got[r], np.asarray(x[r]))


def test_non_finite_values_send_the_pair_raw_but_not_others():
    """A NaN on a rank outside the pair changes nothing; on the pair, both ends send raw."""
    mesh, axis = mesh_of("1d4")
    x = np.asarray(data(4))
    outside, inside = x.copy(), x.copy()
    outside[2, 0, 0] = np.nan
    inside[1, 0, 0] = np.nan

    def pair_sum(v):
        return np.asarray(
            run(lambda a: jaxhc.psum_pair(a, axis, (0, 1), codec="zfp:8"), mesh, jnp.asarray(v))
        )

    clean = pair_sum(x)
    np.testing.assert_array_equal(pair_sum(outside)[:2], clean[:2])
    raw = pair_sum(inside)
    for r in (0, 1):
        np.testing.assert_array_equal(raw[r], inside[0] + inside[1])


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradient_is_the_pair_sum_of_the_cotangent(check_vma):
    mesh, axis = mesh_of("1d4")
    x, w = data(4, 1, integer=True), data(4, 2, integer=True)

    def loss(v):
        fn = jax.shard_map(
            lambda a, b: jaxhc.psum_pair(a, axis, (2, 0), codec="none") * b,
            mesh=mesh,
            in_specs=(jax.P(axis), jax.P(axis)),
            out_specs=jax.P(axis),
            check_vma=check_vma,
        )
        return fn(v, w).sum()

    got = np.asarray(jax.jit(jax.grad(loss))(x))
    want = np.asarray(w).copy()
    want[0] = want[2] = want[0] + want[2]
    np.testing.assert_array_equal(got, want)


def test_a_tree_is_one_message_of_two_of_the_ranks():
    """The ledger: one call per bucket, 2/P of the raw bytes per rank on average; a pair of one
    rank moves nothing."""
    mesh, axis = mesh_of("1d8")
    x = data(8)
    tree = lambda v: {"a": v, "b": v[:, :5]}  # noqa: E731
    with jaxhc.accounting.Ledger() as ledger:
        run(lambda v: jaxhc.psum_pair(tree(v), axis, (0, 7), codec="none")["b"], mesh, x)
        jax.effects_barrier()
    got = ledger.per_axis(devices=8)["x"]
    assert got["calls"] == 1
    assert got["raw_bytes"] == 2 / 8 * 4 * (16 * 12 + 5 * 12)
    with jaxhc.accounting.Ledger() as ledger:
        same = run(lambda v: jaxhc.psum_pair(v, axis, (3, 3), codec="none"), mesh, x)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(x))
    assert ledger.per_axis(devices=8) == {}


def test_a_pair_outside_the_axis_is_a_one_line_error():
    mesh, axis = mesh_of("1d4")
    with pytest.raises(ValueError, match=r"pair \(0, 4\) is outside the axis size 4"):
        run(lambda v: jaxhc.psum_pair(v, axis, (0, 4)), mesh, data(4))
