"""Compressed collectives against jax.lax (and zfpy) on simulated 8-device meshes."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zfpy
from _tiers import quick
from jax import lax

import jaxhc
from jaxhc.codecs import Zfp
from tests._mesh import mesh_of, run
from tests._zfp_oracle import layout

ALL_MESHES = ["1d2", "1d4", "1d8", "3d-tensor", "3d-data-pipe"]
SHAPE = (16, 12)  # per-shard block after the leading device dim


def collectives(axis, parts):
    """name -> (jaxhc call taking codec kwargs, the jax.lax reference)."""
    shift = [(i, (i + 1) % parts) for i in range(parts)]
    half = [(i, i + 1) for i in range(0, parts - 1, 2)]  # ranks that neither send nor receive
    return {
        "psum": (
            lambda x, **kw: jaxhc.psum(x, axis, **kw),
            lambda x: lax.psum(x, axis),
        ),
        "all_gather": (
            lambda x, **kw: jaxhc.all_gather(x, axis, axis=1, **kw),
            lambda x: lax.all_gather(x, axis, axis=1),
        ),
        "all_gather_tiled": (
            lambda x, **kw: jaxhc.all_gather(x, axis, axis=2, tiled=True, **kw),
            lambda x: lax.all_gather(x, axis, axis=2, tiled=True),
        ),
        "psum_scatter": (
            lambda x, **kw: jaxhc.psum_scatter(x, axis, scatter_dimension=1, tiled=True, **kw),
            lambda x: lax.psum_scatter(x, axis, scatter_dimension=1, tiled=True),
        ),
        "ppermute": (
            lambda x, **kw: jaxhc.ppermute(x, axis, shift, **kw),
            lambda x: lax.ppermute(x, axis, shift),
        ),
        "ppermute_partial": (
            lambda x, **kw: jaxhc.ppermute(x, axis, half, **kw),
            lambda x: lax.ppermute(x, axis, half),
        ),
        "all_to_all": (
            lambda x, **kw: jaxhc.all_to_all(x, axis, 1, 2, tiled=True, **kw),
            lambda x: lax.all_to_all(x, axis, 1, 2, tiled=True),
        ),
    }


NAMES = list(collectives("x", 2))


def integer_data(mesh, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 9, size=(mesh.devices.size,) + SHAPE)
    return jnp.asarray(x, dtype)


def smooth_data(mesh, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 6, mesh.devices.size * np.prod(SHAPE)).reshape((-1,) + SHAPE)
    return jnp.asarray(np.sin(t) + 0.01 * rng.standard_normal(t.shape), jnp.float32)


def parts_of(mesh, axis):
    names = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh.shape[a] for a in names]))


# Every mesh and rate under `slow`; the quick suite keeps a few (CI time).
@pytest.mark.parametrize("mesh_name", quick(ALL_MESHES, {"1d4", "3d-data-pipe"}))
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("codec", ["none", "mpc", "mpc:0.3"])
def test_lossless_equals_lax_float32(mesh_name, name, codec):
    mesh, axis = mesh_of(mesh_name)
    ours, ref = collectives(axis, parts_of(mesh, axis))[name]
    x = integer_data(mesh, jnp.float32)
    got = run(lambda a: ours(a, codec=codec), mesh, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(run(ref, mesh, x)))


@pytest.mark.parametrize("mesh_name", ["1d4", "3d-data-pipe"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("codec", ["none", "mpc"])
def test_lossless_equals_lax_bfloat16(mesh_name, name, codec):
    mesh, axis = mesh_of(mesh_name)
    ours, ref = collectives(axis, parts_of(mesh, axis))[name]
    x = integer_data(mesh, jnp.bfloat16)
    got = run(lambda a: ours(a, codec=codec), mesh, x)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got, np.float32), np.asarray(run(ref, mesh, x), np.float32)
    )


def _zfp_tolerance(x, rate, terms):
    """A loose bound for fixed-rate zfp: a few ulps at `rate - 4` bits of the data's range."""
    scale = float(np.max(np.abs(np.asarray(x, np.float64)))) * terms
    return scale * 2.0 ** (-(rate - 5))


@pytest.mark.parametrize("mesh_name", ["1d4", "3d-tensor", "3d-data-pipe"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "rate,layout_", quick([(8, ""), (16, ""), (8, ":d3"), (16, ":d2")], {(8, ""), (16, ":d2")})
)
def test_zfp_within_bound_of_lax(mesh_name, name, rate, layout_):
    mesh, axis = mesh_of(mesh_name)
    parts = parts_of(mesh, axis)
    ours, ref = collectives(axis, parts)[name]
    x = smooth_data(mesh)
    got = np.asarray(run(lambda a: ours(a, codec=f"zfp:{rate}{layout_}"), mesh, x))
    want = np.asarray(run(ref, mesh, x))
    terms = parts + 1 if name.startswith("psum") else 1
    np.testing.assert_allclose(got, want, rtol=0, atol=_zfp_tolerance(x, rate, terms))


def _zfpy_round_trip(a, rate, dims=1):
    """zfpy's round trip of the 1-D a in our dims-D layout (tests/_zfp_oracle.py)."""
    a = np.ascontiguousarray(a, np.float32).reshape(-1)
    y = zfpy.decompress_numpy(zfpy.compress_numpy(layout(a, dims), rate=rate))
    return y.reshape(-1)[: a.size]


@pytest.mark.parametrize("parts", [2, 4, 8])
@pytest.mark.parametrize("rate,dims", [(8, 1), (16, 1), (8, 3), (12, 2)])
def test_zfp_psum_is_bit_identical_to_a_zfpy_emulation(parts, rate, dims):
    """The algorithm of DESIGN.md replayed with numpy + zfpy gives the same bits."""
    mesh, axis = mesh_of(f"1d{parts}")
    x = smooth_data(mesh, seed=parts)
    spec = f"zfp:{rate}" + (f":d{dims}" if dims > 1 else "")
    got = np.asarray(run(lambda a: jaxhc.psum(a, axis, codec=spec), mesh, x))

    blocks = np.asarray(x).reshape(parts, -1)
    n = blocks.shape[1]
    per = -(-n // parts)
    m = -(-per // 4) * 4
    rows = np.zeros((parts, parts * m), np.float32)
    rows[:, :n] = blocks
    rows = rows.reshape(parts, parts, m)  # [rank, chunk]
    out = []
    for j in range(parts):
        acc = _zfpy_round_trip(rows[0, j], rate, dims).astype(np.float32)
        for r in range(1, parts):
            acc = acc + _zfpy_round_trip(rows[r, j], rate, dims)
        out.append(_zfpy_round_trip(acc, rate, dims))
    want = np.concatenate(out)[:n]
    for r in range(parts):
        np.testing.assert_array_equal(got[r].reshape(-1), want)


@pytest.mark.parametrize("parts", [2, 8])
@pytest.mark.parametrize("dims", [1, 3])
def test_zfp_all_gather_is_bit_identical_to_zfpy(parts, dims):
    mesh, axis = mesh_of(f"1d{parts}")
    x = smooth_data(mesh, seed=3)
    spec = "zfp:8" + (f":d{dims}" if dims > 1 else "")
    got = np.asarray(run(lambda a: jaxhc.all_gather(a, axis, codec=spec), mesh, x))
    want = np.stack([_zfpy_round_trip(b, 8, dims) for b in np.asarray(x)])
    got = got.reshape(parts, parts, -1)  # [rank, gathered block, values]
    for r in range(parts):
        np.testing.assert_array_equal(got[r], want)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("codec", ["none", "mpc", "zfp:16"])
def test_gradients_match_lax(name, check_vma, codec):
    mesh, axis = mesh_of("3d-data-pipe")
    ours, ref = collectives(axis, parts_of(mesh, axis))[name]
    x = integer_data(mesh, jnp.float32, seed=1) / 4
    weights = jnp.asarray(np.random.default_rng(2).integers(-3, 4, size=64), jnp.float32)

    def loss(f):
        def total(a):
            y = run(f, mesh, a, check_vma=check_vma).reshape(-1)
            w = jnp.resize(weights, y.shape)
            return jnp.sum(w * y**2)

        return jax.jit(jax.grad(total))

    got = loss(lambda a: ours(a, codec=codec))(x)
    want = loss(ref)(x)
    if codec == "zfp:16":
        scale = float(jnp.max(jnp.abs(want)))
        np.testing.assert_allclose(got, want, rtol=0, atol=scale * 2.0**-9)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_non_tiled_all_to_all_and_its_gradient():
    # lax's own transpose of a non-tiled all_to_all fails in jax 0.10; compare with the tiled one.
    mesh, axis = mesh_of("1d4")
    x = integer_data(mesh, jnp.float32)

    def ours(a):
        return jaxhc.all_to_all(a[:, :4], axis, 1, 2, codec="none")

    def ref(a):
        return lax.all_to_all(a[:, :4], axis, 1, 2, tiled=True).reshape(1, 4, 12).transpose(0, 2, 1)

    np.testing.assert_array_equal(run(ours, mesh, x), run(ref, mesh, x))

    def grad(f):
        return jax.grad(lambda a: jnp.sum(run(f, mesh, a) ** 2 * jnp.arange(4.0)))(x)

    np.testing.assert_array_equal(grad(ours), grad(ref))


@pytest.mark.parametrize("codec", ["zfp:8", "zfp:8:d3", "q4"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter", "ppermute", "all_to_all"])
def test_non_finite_under_a_lossy_codec_falls_back_to_plain_lax(bad, name, codec):
    mesh, axis = mesh_of("1d4")
    ours, ref = collectives(axis, 4)[name]
    x = np.asarray(smooth_data(mesh)).copy()
    x[2, 3, 5] = bad  # one rank, one value
    x = jnp.asarray(x)
    with jaxhc.accounting.Ledger() as ledger:
        got = jax.block_until_ready(run(lambda a: ours(a, codec=codec), mesh, x))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(run(ref, mesh, x)))
    assert ledger.per_axis(devices=4)["x"]["fallbacks"] == 1.0


def test_integer_inputs_go_raw():
    mesh, axis = mesh_of("1d4")
    x = jnp.asarray(np.arange(4 * 16 * 12).reshape((4,) + SHAPE), jnp.int32)
    fn = jax.jit(
        jax.shard_map(
            lambda a: jaxhc.psum(a, axis, codec="zfp:8"),
            mesh=mesh,
            in_specs=jax.P("x"),
            out_specs=jax.P("x"),
        )
    )
    np.testing.assert_array_equal(fn(x), run(lambda a: lax.psum(a, axis), mesh, x))
    assert "jaxhc_zfp" not in fn.lower(x).as_text()


def test_policy_min_bytes_and_kinds():
    mesh, axis = mesh_of("1d4")
    policy = jaxhc.Policy.from_dict(
        {"min_bytes": 1024, "axes": {"x": {"codec": "zfp:8", "act": "off"}}}
    )

    def psum_of(kind):
        return jax.jit(
            jax.shard_map(
                lambda a: jaxhc.psum(a, axis, policy=policy, kind=kind),
                mesh=mesh,
                in_specs=jax.P("x"),
                out_specs=jax.P("x"),
            )
        )

    x = smooth_data(mesh)  # 768 bytes per shard: under min_bytes -> plain
    assert "jaxhc_zfp" not in psum_of("grad").lower(x).as_text()
    big = jnp.tile(x, (1, 2, 1))  # 1536 bytes per shard
    assert "jaxhc_zfp_encode" in psum_of("grad").lower(big).as_text()
    assert "jaxhc_zfp" not in psum_of("act").lower(big).as_text()


def _collective_bytes(hlo: str, op: str) -> list[int]:
    """Byte sizes of the u8 operands of `op` instructions in optimized HLO text."""
    sizes = []
    for line in hlo.splitlines():
        if f" {op}(" in line or f" {op}-start(" in line:
            m = re.search(r"= \(?u8\[([\d,]+)\]", line)
            if m:
                sizes.append(int(np.prod([int(d) for d in m.group(1).split(",")])))
    return sizes


@pytest.mark.parametrize("rate", [8, 16])
def test_hlo_of_compressed_psum_moves_compressed_bytes(rate):
    parts = 8
    mesh, axis = mesh_of("1d8")
    n = 4096
    x = jnp.zeros((parts, n), jnp.float32)
    fn = jax.jit(
        jax.shard_map(
            lambda a: jaxhc.psum(a, axis, codec=f"zfp:{rate}"),
            mesh=mesh,
            in_specs=jax.P("x"),
            out_specs=jax.P("x"),
        )
    )
    hlo = fn.lower(x).compile().as_text()
    assert "jaxhc_zfp_encode" in hlo and "jaxhc_zfp_decode" in hlo
    a2a = _collective_bytes(hlo, "all-to-all")
    ag = _collective_bytes(hlo, "all-gather")
    assert a2a and ag, "the compressed payloads must travel as uint8 collectives"
    # Per rank: (P-1)/P of the all_to_all buffer plus (P-1)/P of the gathered buffer.
    wire = (parts - 1) / parts * (sum(a2a) + sum(ag))
    raw = 2 * (parts - 1) / parts * n * 4
    ratio = 32 / rate
    assert wire <= raw / ratio * 1.02 + 64


def test_accounting_records_raw_and_wire_bytes():
    mesh, axis = mesh_of("1d4")
    x = smooth_data(mesh)
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(
            run(lambda a: jaxhc.psum(a, axis, codec="zfp:8", kind="grad"), mesh, x)
        )
        jax.block_until_ready(run(lambda a: jaxhc.psum(a, axis), mesh, x))
    per = ledger.per_axis(devices=4, by_kind=True)
    raw = 2 * 3 / 4 * 16 * 12 * 4
    assert per["x/grad"]["raw_bytes"] == pytest.approx(raw)
    assert per["x/grad"]["wire_bytes"] < raw / 3
    assert per["x/grad"]["fallbacks"] == 0 and per["x/grad"]["calls"] == 1
    assert per["x/other"]["wire_bytes"] == pytest.approx(raw)


def test_accounting_costs_nothing_outside_a_ledger():
    """No host callback is compiled into a program called outside every Ledger; the first call
    inside one compiles the program again with its callbacks (whether one is active is in jit's
    cache key), and it records."""
    mesh, axis = mesh_of("1d4")
    spec = jax.sharding.PartitionSpec(axis)
    step = jax.jit(
        jax.shard_map(
            lambda a: jaxhc.psum(a, axis, codec="zfp:8"), mesh=mesh, in_specs=spec, out_specs=spec
        )
    )
    x = smooth_data(mesh)
    assert "callback" not in step.lower(x).compile().as_text()
    jax.block_until_ready(step(x))
    with jaxhc.accounting.Ledger() as ledger:
        assert "callback" in step.lower(x).compile().as_text()
        jax.block_until_ready(step(x))
        jax.effects_barrier()
    assert ledger.per_axis(devices=4)["x"]["calls"] == 1


def test_bad_arguments_are_one_line_errors():
    mesh, axis = mesh_of("1d4")
    x = smooth_data(mesh)
    with pytest.raises(ValueError, match="either codec= or policy="):
        run(lambda a: jaxhc.psum(a, axis, codec="zfp:8", policy="zhybrid"), mesh, x)
    with pytest.raises(ValueError, match="bad codec spec 'zfp'"):
        run(lambda a: jaxhc.psum(a, axis, codec="zfp"), mesh, x)
    with pytest.raises(ValueError, match="dimension 1 of shape .* multiple of 4"):
        run(
            lambda a: jaxhc.psum_scatter(
                a[:, :3], axis, scatter_dimension=1, tiled=True, codec="none"
            ),
            mesh,
            x,
        )
    with pytest.raises(ValueError, match="repeats a source"):
        run(lambda a: jaxhc.ppermute(a, axis, [(0, 1), (0, 2)], codec="none"), mesh, x)
    with pytest.raises(ValueError, match="axis_index_groups"):
        run(
            lambda a: jaxhc.psum(a, axis, axis_index_groups=[[0, 1], [2, 3]], codec="none"), mesh, x
        )


def test_codec_objects_and_specs_are_interchangeable():
    mesh, axis = mesh_of("1d2")
    x = smooth_data(mesh)
    a = run(lambda v: jaxhc.psum(v, axis, codec=Zfp(rate=12)), mesh, x)
    b = run(lambda v: jaxhc.psum(v, axis, codec="zfp:12"), mesh, x)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("codec", ["none", "mpc"])
@pytest.mark.parametrize("shape", [(1,), (3,), (5, 7), (2, 3, 9)])
def test_odd_sizes_equal_lax(shape, codec):
    """Sizes that leave partial rows and partial zfp blocks in every chunk."""
    mesh, axis = mesh_of("1d4")
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.integers(-8, 9, size=(4,) + shape), jnp.float32)
    for ours, ref in [
        (lambda a: jaxhc.psum(a, axis, codec=codec), lambda a: lax.psum(a, axis)),
        (lambda a: jaxhc.all_gather(a, axis, codec=codec), lambda a: lax.all_gather(a, axis)),
        (
            lambda a: jaxhc.ppermute(a, axis, [(0, 3), (3, 0)], codec=codec),
            lambda a: lax.ppermute(a, axis, [(0, 3), (3, 0)]),
        ),
    ]:
        np.testing.assert_array_equal(run(ours, mesh, x), run(ref, mesh, x))


@pytest.mark.parametrize("codec", [None, "none", "zfp:16"])
def test_accounting_counts_every_execution_in_scan_under_grad(codec):
    """Forward and backward traffic of a collective inside lax.scan, compressed or plain."""
    mesh, axis = mesh_of("1d2")
    swap = [(0, 1), (1, 0)]

    def body(h, _):
        return jaxhc.ppermute(h, axis, swap, codec=codec, kind="act") * 1.5, None

    def loss(a):
        fn = jax.shard_map(
            lambda v: lax.scan(body, v, None, length=3)[0],
            mesh=mesh,
            in_specs=jax.P("x"),
            out_specs=jax.P("x"),
        )
        return fn(a).sum()

    x = smooth_data(mesh)
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(jax.jit(jax.grad(loss))(x))
    calls = ledger.per_axis(devices=2)["x"]["calls"]
    assert calls == 6  # 3 forward sends + 3 backward sends
