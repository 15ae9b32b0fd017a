"""ZFP fixed-rate codec against the outside oracle zfpy (the zfpy 1.0.1 wheel).

Every stream must be byte-identical to ``zfpy.compress_numpy(x, rate, write_header=False)`` and
every decoded value bit-identical to zfpy's decompression of that stream. The same assertions run
on each platform jax offers (the GPU ones are marked ``gpu`` and skipped without a GPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zfpy
from _tiers import quick
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxhc.codecs import Codec, Zfp, parse
from tests._zfp_oracle import (
    F32_RATES,
    F64_RATES,
    ND_F32_RATES,
    ND_F64_RATES,
    assert_matches_zfpy,
    bits,
    families,
    ours_roundtrip,
    zfpy_roundtrip,
)


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


PLATFORMS = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "gpu",
        id="gpu",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="no GPU")],
    ),
]


@pytest.fixture(params=PLATFORMS)
def device(request):
    return jax.devices(request.param)[0]


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# --- identity with zfpy ------------------------------------------------------------------------


@pytest.mark.parametrize("rate", F32_RATES)
def test_float32_matches_zfpy(rate, device):
    for x in families(np.float32, 1003).values():
        assert_matches_zfpy(x, rate, device)


@pytest.mark.parametrize("rate", F64_RATES)
def test_float64_matches_zfpy(rate, device, x64):
    for x in families(np.float64, 1003).values():
        assert_matches_zfpy(x, rate, device)


def some_lengths():
    # every n % 4 and every block count up to 17, word/group boundaries (a group is at most 64
    # blocks), and the longest; test_zfp_kernels covers 1..4099 for every CPU kernel.
    return [*range(1, 69), *range(127, 134), *range(255, 262), 1023, 1024, 1025, *range(4093, 4100)]


@pytest.mark.parametrize("dtype,rate", [(np.float32, 8), (np.float64, 12.25)])
def test_lengths_match_zfpy(dtype, rate, device, x64):
    x = families(dtype, 4099, seed=1)["walk"]
    for n in some_lengths():
        assert_matches_zfpy(x[:n], rate, device)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rate", [(np.float32, 8), (np.float64, 16)])
def test_all_lengths_match_zfpy(dtype, rate, device, x64):
    x = families(dtype, 4099, seed=2)["magnitudes"]
    for n in range(1, 4100):
        assert_matches_zfpy(x[:n], rate, device)


@pytest.mark.parametrize(
    "dtype,n,rate",
    [(np.float32, 1 << 20, 8), (np.float32, 3_000_001, 16), (np.float64, 1_000_003, 24)],
)
def test_long_arrays_match_zfpy(dtype, n, rate, device, x64):
    rng = np.random.default_rng(n)
    x = (np.cumsum(rng.standard_normal(n)) * rng.uniform(0.5, 2, n)).astype(dtype)
    assert_matches_zfpy(x, rate, device)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_narrow_floats_widen_to_float32(dtype, device):
    x = families(np.float32, 999)["smooth"].astype(dtype)
    codec = Zfp(rate=12)
    e = jax.jit(codec.encode)(jax.device_put(x, device))
    y = jax.jit(lambda p: codec.decode(p, x.shape, dtype))(e.payload)
    ref_stream, ref_y = zfpy_roundtrip(x.astype(np.float32), 12)
    assert np.asarray(e.payload).tobytes() == ref_stream
    assert y.dtype == dtype
    np.testing.assert_array_equal(bits(np.asarray(y)), bits(ref_y.astype(dtype)))


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_decode_sum_equals_decode_then_sum(dtype, dims, device):
    """The fused handler against decoding each payload and adding the rows in rank order (random
    payload bytes: every exponent, overflows to inf, inf - inf)."""
    codec, m = Zfp(rate=8, dims=dims), 1001
    rng = np.random.default_rng(1)
    size = codec.payload_bytes(m, dtype)
    payloads = jax.device_put(rng.integers(0, 256, (3, size), np.uint8), device)
    fused = jax.jit(lambda p: codec.decode_sum(p, m, dtype))(payloads)
    unfused = jax.jit(lambda p: Codec.decode_sum(codec, p, m, dtype))  # the generic path
    np.testing.assert_array_equal(bits(np.asarray(fused)), bits(np.asarray(unfused(payloads))))


# --- 2-D and 3-D blocks ------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype,rates", [(np.float32, ND_F32_RATES), (np.float64, ND_F64_RATES)])
def test_nd_matches_zfpy(dims, dtype, rates, device, x64):
    for rate in rates:
        for x in families(dtype, 1003).values():
            assert_matches_zfpy(x, rate, device, dims)


# Every length compiles its own programs: the quick suite runs 3-D float32 and 2-D float64 (the
# host kernels' lengths are also checked without jit in test_zfp_kernels.py); all under `slow`.
@pytest.mark.parametrize(
    "dims, dtype, rate",
    quick(
        [
            (d, t, r)
            for t, r in [(np.float32, 8), (np.float64, 12.25), (np.float32, 2.5)]
            for d in (2, 3)
        ],
        {(3, np.float32, 8), (2, np.float64, 12.25)},
    ),
)
def test_nd_lengths_match_zfpy(dims, dtype, rate, device, x64):
    """Every partial last row (n % 4) and, in 3-D, partial last plane (n % 16) and block
    (n % 64), around word and thread-group boundaries."""
    x = families(dtype, 4099, seed=1)["magnitudes"]
    for n in [*range(1, 140), *range(1020, 1030), *range(4090, 4100)]:
        assert_matches_zfpy(x[:n], rate, device, dims)


@pytest.mark.parametrize("dims,n,rate", [(3, 1 << 20, 8), (2, 3_000_001, 5), (3, 1_000_003, 16)])
def test_nd_long_arrays_match_zfpy(dims, n, rate, device):
    rng = np.random.default_rng(n)
    x = (np.cumsum(rng.standard_normal(n)) * rng.uniform(0.5, 2, n)).astype(np.float32)
    assert_matches_zfpy(x, rate, device, dims)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_nd_narrow_floats_widen_to_float32(dims, dtype, device):
    x = families(np.float32, 999)["walk"].astype(dtype)
    codec = Zfp(rate=6, dims=dims)
    e = jax.jit(codec.encode)(jax.device_put(x, device))
    y = jax.jit(lambda p: codec.decode(p, x.shape, dtype))(e.payload)
    ref_stream, ref_y = zfpy_roundtrip(x.astype(np.float32), 6, dims)
    assert np.asarray(e.payload).tobytes() == ref_stream
    assert y.dtype == dtype
    np.testing.assert_array_equal(bits(np.asarray(y)), bits(ref_y.astype(dtype)))


def test_nd_blocks_are_more_accurate_per_bit_on_noise():
    """One exponent per 64 values instead of per 4: the relative L2 error of zfp:8:d3 on
    gradient-like noise (heavy-tailed magnitudes) is well below that of zfp:8."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1 << 16) * np.exp(rng.standard_normal(1 << 16))).astype(np.float32)

    def err(codec):
        y = codec.decode_numpy(codec.encode_numpy(x)[0], x.size, np.float32)
        return np.linalg.norm(y - x) / np.linalg.norm(x)

    assert err(Zfp(8, dims=3)) * 2.5 <= err(Zfp(8))
    assert err(Zfp(8, dims=3)) < err(Zfp(8, dims=2)) < err(Zfp(8))


# --- non-finite input ----------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nonfinite_reports_not_ok(dtype, dims, device, x64):
    x = families(dtype, 1001)["noisy"]
    x[::7], x[3::11], x[5::13] = np.nan, np.inf, -np.inf
    codec = Zfp(rate=8, dims=dims)
    e = jax.jit(codec.encode)(jax.device_put(x, device))
    assert not bool(e.ok)
    y = np.asarray(jax.jit(lambda p: codec.decode(p, x.shape, dtype))(e.payload))
    assert y.shape == x.shape
    clean = x.copy()
    clean[~np.isfinite(clean)] = 0
    assert bool(jax.jit(codec.encode)(jax.device_put(clean, device)).ok)


def test_finite_flag_is_per_row(device):
    x = families(np.float32, 500)["walk"][None].repeat(4, axis=0)
    x[2, 17] = np.nan
    e = jax.jit(jax.vmap(Zfp(rate=8).encode))(jax.device_put(x, device))
    assert np.asarray(e.ok).tolist() == [True, True, False, True]


# --- transformations ---------------------------------------------------------------------------


def test_vmap_rows_equal_single_rows(device):
    xs = np.stack(list(families(np.float32, 777).values()))
    codec = Zfp(rate=5.5)
    batched = jax.jit(jax.vmap(codec.encode))(jax.device_put(xs, device))
    assert batched.payload.shape == (len(xs), codec.payload_bytes(777, jnp.float32))
    ys = jax.jit(jax.vmap(lambda p: codec.decode(p, (777,), jnp.float32)))(batched.payload)
    for i, x in enumerate(xs):
        single, single_y, _ = ours_roundtrip(x, 5.5, device)
        stream, ref_y = zfpy_roundtrip(x, 5.5)
        assert np.asarray(batched.payload[i]).tobytes() == single == stream
        np.testing.assert_array_equal(bits(np.asarray(ys[i])), bits(single_y))
        np.testing.assert_array_equal(bits(single_y), bits(ref_y))


def test_inside_shard_map_on_8_host_devices():
    devices = jax.devices("cpu")
    assert len(devices) == 8, "tests/conftest.py forces 8 host devices"
    mesh = Mesh(np.array(devices), ("x",))
    codec = Zfp(rate=8)
    n_local = 1001
    x = families(np.float32, 8 * n_local)["walk"]

    def per_shard(xs):
        e = codec.encode(xs)
        return e.payload, codec.decode(e.payload, xs.shape, xs.dtype)

    fn = jax.jit(
        jax.shard_map(per_shard, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    )
    payload, y = fn(x)
    size = codec.payload_bytes(n_local, jnp.float32)
    payload, y = np.asarray(payload), np.asarray(y)
    for s in range(8):
        stream, ref_y = zfpy_roundtrip(x[s * n_local : (s + 1) * n_local], 8)
        assert payload[s * size : (s + 1) * size].tobytes() == stream
        np.testing.assert_array_equal(bits(y[s * n_local : (s + 1) * n_local]), bits(ref_y))


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate,dtype,culprit",
    [
        (2, jnp.float32, "rate 2"),
        (33, jnp.float32, "rate 33"),
        (65, jnp.float64, "rate 65"),
        (float("nan"), jnp.float32, "rate nan"),
        (True, jnp.float32, "rate True"),
    ],
)
def test_bad_rate_is_a_value_error(rate, dtype, culprit):
    with pytest.raises(ValueError, match=culprit):
        Zfp(rate=rate).encode(jnp.ones(8, dtype))


@pytest.mark.parametrize(
    "kwargs,culprit",
    [
        ({"rate": 0.5, "dims": 3}, "rate 0.5 is out of range in 3-D"),
        ({"rate": 8, "dims": 4}, "dims 4 must be 1, 2 or 3"),
        ({"rate": 8, "dims": True}, "dims True"),
    ],
)
def test_bad_dims_or_nd_rate_is_a_value_error(kwargs, culprit):
    with pytest.raises(ValueError, match=culprit):
        Zfp(**kwargs)


def test_nd_spec_round_trips():
    assert parse("zfp:8:d3") == Zfp(8, dims=3) and parse("zfp:8:d3").spec == "zfp:8:d3"
    assert parse("zfp:2.5:d2").spec == "zfp:2.5:d2" and parse("zfp:8:d1") == Zfp(8)
    with pytest.raises(ValueError, match="'d4' is not a block layout"):
        parse("zfp:8:d4")


def test_integer_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="int32"):
        Zfp(rate=8).encode(jnp.ones(8, jnp.int32))


def test_handler_rejects_bad_buffers():
    x = jnp.ones(10, jnp.float32)
    call = functools.partial(jax.ffi.ffi_call, "jaxhc_zfp_encode")
    results = (jax.ShapeDtypeStruct((160,), jnp.uint8), jax.ShapeDtypeStruct((), jnp.bool_))
    with pytest.raises(Exception, match="maxbits 300 is out of range 9..128 for float32 in 1-D"):
        call(results)(x, maxbits=300, dims=1)
    with pytest.raises(Exception, match="maxbits 3000 is out of range 9..2048 for float32 in 3-D"):
        call(results)(x, maxbits=3000, dims=3)
    with pytest.raises(Exception, match="dims 4 is not 1, 2 or 3"):
        call(results)(x, maxbits=32, dims=4)
    with pytest.raises(Exception, match="payload shape"):
        call((jax.ShapeDtypeStruct((7,), jnp.uint8), jax.ShapeDtypeStruct((), jnp.bool_)))(
            x, maxbits=32, dims=1
        )
    with pytest.raises(Exception, match="float32, float64, bfloat16 or float16"):
        call((jax.ShapeDtypeStruct((8,), jnp.uint8), jax.ShapeDtypeStruct((), jnp.bool_)))(
            x.astype(jnp.int32), maxbits=32, dims=1
        )
    call = functools.partial(jax.ffi.ffi_call, "jaxhc_zfp_decode_sum")
    with pytest.raises(Exception, match=r"payloads \[3,40\] must be \[..., parts, bytes\]"):
        call(jax.ShapeDtypeStruct((2, 10), jnp.float32))(
            jnp.zeros((3, 40), jnp.uint8), maxbits=32, dims=1
        )
    with pytest.raises(Exception, match="payload shape"):
        call(jax.ShapeDtypeStruct((10,), jnp.float32))(
            jnp.zeros((3, 48), jnp.uint8), maxbits=32, dims=1
        )


@pytest.mark.parametrize(
    "dtype,rate,dims",
    [
        (np.float32, 7, 1),
        (np.float32, 32, 1),
        (np.float64, 50, 1),
        (np.float32, 3.5, 2),
        (np.float32, 8, 3),
        (np.float32, 32, 3),
        (np.float64, 50, 3),
    ],
)
def test_decode_of_arbitrary_bytes_matches_zfpy(dtype, rate, dims, device, x64):
    codec = Zfp(rate=rate, dims=dims)
    rng = np.random.default_rng(3)
    payload = rng.integers(0, 256, codec.payload_bytes(4096, dtype), dtype=np.uint8)
    y = jax.jit(lambda p: codec.decode(p, (4096,), dtype))(jax.device_put(payload, device))
    shape = {1: [4096], 2: [1024, 4], 3: [256, 4, 4]}[dims]
    ref = zfpy._decompress(
        payload.tobytes(), zfpy.dtype_to_ztype(np.dtype(dtype)), shape, rate=rate
    )
    np.testing.assert_array_equal(bits(np.asarray(y)), bits(np.asarray(ref).reshape(-1)))


def test_host_entry_points_take_read_only_arrays_and_reject_bad_input():
    x = np.asarray(jnp.linspace(-1, 1, 999, dtype=jnp.float32))  # read-only view of a jax array
    assert not x.flags.writeable
    stream, finite = Zfp(8).encode_numpy(x)
    assert stream == zfpy.compress_numpy(x, rate=8, write_header=False) and finite
    with pytest.raises(ValueError, match="int32"):
        Zfp(8).encode_numpy(np.arange(8, dtype=np.int32))
    with pytest.raises(ValueError, match="does not hold 10 values"):
        Zfp(8).decode_numpy(stream, 10, np.float32)
