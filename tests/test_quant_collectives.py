"""Every collective under q8/q4 on simulated 8-device meshes: bit for bit `jax.lax` on the
values the numpy oracle (tests/_quant_oracle.py) decodes, sums replayed in rank order; within the
quantization bound of lax on the raw inputs on 3-D meshes (NaN/Inf: tests/test_collectives.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _quant_oracle import round_trip
from _tiers import quick
from test_collectives import NAMES, collectives, parts_of

import jaxhc
from jaxhc.codecs import parse
from tests._mesh import mesh_of, run

SHAPE = (16, 40)  # per shard: 640 values, blocks of 256 (two full, one partial) or 64
SPECS = ["q8", "q4:b64"]


def data(mesh, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((mesh.devices.size,) + SHAPE) * np.exp(rng.uniform(-2, 2, SHAPE))
    return x.astype(dtype)


def rt(a, codec):
    return round_trip(a, codec.bits, codec.block, codec.stochastic, codec.seed)


def rt_chunks(a, codec, axis, parts, moved_order=True):
    """Round trip of each of the P chunks of `a` along `axis`: each flattened with `axis` first
    (the rows psum_scatter encodes) or in `a`'s axis order (all_to_all's)."""
    if not moved_order:
        return np.concatenate([rt(c, codec) for c in np.split(a, parts, axis=axis)], axis=axis)
    moved = np.moveaxis(a, axis, 0)
    back = np.stack([rt(r, codec) for r in moved.reshape(parts, -1)]).reshape(moved.shape)
    return np.moveaxis(back, 0, axis)


def rank_sum(rows, dtype):
    """Rows added in rank order in float32, rounded to `dtype` (the compressed reduction)."""
    acc = rows[0].astype(np.float32)
    for r in rows[1:]:
        acc = acc + r.astype(np.float32)
    return acc.astype(dtype)


def emulate_psum(x, codec, parts):
    """jaxhc.psum of DESIGN.md replayed: chunks of each rank, rank-order sum of their decoded
    values, the reduced chunk through the codec again."""
    n = x[0].size
    per = -(-n // parts)
    flat = np.zeros((parts, parts * per), x.dtype)
    flat[:, :n] = x.reshape(parts, n)
    chunks = flat.reshape(parts, parts, per)  # [rank, chunk]
    out = [
        rt(rank_sum([rt(chunks[r, j], codec) for r in range(parts)], x.dtype), codec)
        for j in range(parts)
    ]
    return np.concatenate(out)[:n].reshape(x.shape[1:])


def emulate_psum_scatter(x, codec, parts, dim):
    """jaxhc.psum_scatter(tiled, scatter_dimension=dim) per rank (dim counts the local shape)."""
    decoded = [rt_chunks(x[r : r + 1], codec, dim, parts) for r in range(parts)]
    total = rank_sum(decoded, x.dtype)
    return np.split(total, parts, axis=dim)


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("mesh_name", quick(["1d2", "1d8"], {"1d8"}))  # both: `slow` (CI time)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spec", [*SPECS, "q8:sr5"])
def test_equals_lax_on_oracle_decoded_inputs(mesh_name, name, spec):
    mesh, axis = mesh_of(mesh_name)
    parts = parts_of(mesh, axis)
    codec = parse(spec)
    ours, ref = collectives(axis, parts)[name]
    x = data(mesh, seed=parts)
    got = np.asarray(run(lambda a: ours(a, codec=spec), mesh, jnp.asarray(x)))
    if name == "psum":
        want = np.concatenate([emulate_psum(x, codec, parts)[None]] * parts)
    elif name == "psum_scatter":
        want = np.concatenate(emulate_psum_scatter(x, codec, parts, 1))
    else:
        if name == "all_to_all":  # each chunk along the split axis is encoded on its own
            decoded = np.concatenate(
                [rt_chunks(x[r : r + 1], codec, 1, parts, False) for r in range(parts)]
            )
        else:  # the whole local block is one row
            decoded = np.stack([rt(b, codec) for b in x])
        want = np.asarray(run(ref, mesh, jnp.asarray(decoded)))
    assert_same_bits(got, want)


@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter"])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_narrow_types_equal_the_emulation(name, dtype):
    mesh, axis = mesh_of("1d4")
    codec = parse("q8")
    ours, ref = collectives(axis, 4)[name]
    x = data(mesh, dtype, seed=5)
    got = run(lambda a: ours(a, codec="q8"), mesh, jnp.asarray(x))
    assert got.dtype == dtype
    if name == "psum":
        want = np.concatenate([emulate_psum(x, codec, 4)[None]] * 4)
    elif name == "psum_scatter":
        want = np.concatenate(emulate_psum_scatter(x, codec, 4, 1))
    else:
        want = np.asarray(run(ref, mesh, jnp.asarray(np.stack([rt(b, codec) for b in x]))))
    assert_same_bits(got, want)


@pytest.mark.parametrize("mesh_name", quick(["3d-tensor", "3d-data-pipe"], {"3d-data-pipe"}))
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spec", SPECS)
def test_within_the_quantization_bound_of_lax(mesh_name, name, spec):
    """Each decoded value is within half a step (absmax / Q / 2) of its input: one step per input
    of a sum plus one for the reduced value bounds the error of psum."""
    mesh, axis = mesh_of(mesh_name)
    parts = parts_of(mesh, axis)
    codec = parse(spec)
    ours, ref = collectives(axis, parts)[name]
    x = data(mesh, seed=1)
    got = np.asarray(run(lambda a: ours(a, codec=spec), mesh, jnp.asarray(x)))
    want = np.asarray(run(ref, mesh, jnp.asarray(x)))
    step = float(np.abs(x).max()) / codec.qmax
    terms = parts + 1 if name.startswith("psum") else 1
    err = np.abs(got - want).max()
    assert err <= terms * parts * step / 2 * 1.001
    assert err <= (step / 2 * 1.001 if terms == 1 else np.inf)


@pytest.mark.parametrize("spec", SPECS)
def test_psum_moves_the_payload_bytes(spec):
    mesh, axis = mesh_of("1d4")
    codec = parse(spec)
    x = jnp.asarray(data(mesh))
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(run(lambda a: jaxhc.psum(a, axis, codec=spec), mesh, x))
    per = ledger.per_axis(devices=4)["x"]
    chunk = codec.payload_bytes(640 // 4, jnp.float32)
    assert per["fallbacks"] == 0
    assert per["wire_bytes"] == pytest.approx(2 * 3 * chunk + 2 * 3 * 4)  # + the ok agreements
    assert per["wire_bytes"] < per["raw_bytes"] * codec.bits_per_value / 32 * 1.2


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter", "ppermute"])
def test_gradients_within_the_bound_of_lax(name, check_vma):
    mesh, axis = mesh_of("1d4")
    ours, ref = collectives(axis, 4)[name]
    x = jnp.asarray(data(mesh, seed=2))
    weights = jnp.asarray(np.random.default_rng(3).standard_normal(64), jnp.float32)

    def grad(f):
        def total(a):
            y = run(f, mesh, a, check_vma=check_vma).reshape(-1)
            return jnp.sum(jnp.resize(weights, y.shape) * y**2)

        return np.asarray(jax.jit(jax.grad(total))(x))

    got, want = grad(lambda a: ours(a, codec="q8")), grad(ref)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=scale * 8 * 4 / 127)
    assert np.abs(got - want).max() > 0  # compressed: not the plain path
