"""Every CPU ZFP kernel (AVX-512, AVX2, scalar BMI2, portable) against the outside oracles.

JAXHC_ZFP_KERNEL forces a kernel; those this CPU cannot run are skipped. Streams must be
byte-identical to zfpy's and decoded values bit-identical to zfpy's decompression (rounded to
bfloat16/float16 by jnp where those are asked for); the fused decode-and-sum must equal decoding
each payload and adding the rows in rank order (the generic ``Codec.decode_sum``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiers import quick

from jaxhc import _native
from jaxhc.codecs import Codec, Zfp
from tests._zfp_oracle import (
    F32_RATES,
    F64_RATES,
    ND_F32_RATES,
    assert_matches_zfpy,
    bits,
    families,
    fma_telling_payloads,
    ours_roundtrip,
    zfpy_roundtrip,
)

KERNELS = ["avx512", "avx2", "bmi2", "portable"]
CPU = jax.devices("cpu")[0]


@pytest.fixture(params=KERNELS)
def kernel(request, monkeypatch):
    if request.param not in _native.cpu.zfp_kernels():
        pytest.skip(f"this CPU cannot run the {request.param} kernel")
    monkeypatch.setenv("JAXHC_ZFP_KERNEL", request.param)
    return request.param


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def specials(dtype, n: int, seed: int = 0) -> np.ndarray:
    """Values a lane coder must code itself or hand to the scalar one: exponents spread over the
    whole range inside each block, ±0, subnormals, NaN, ±inf and the largest finite values,
    sprinkled over otherwise ordinary stretches."""
    rng = np.random.default_rng(seed)
    fi = np.finfo(dtype)
    with np.errstate(over="ignore"):
        x = rng.standard_normal(n) * 2.0 ** rng.integers(fi.minexp - fi.nmant, fi.maxexp, n)
    pick = rng.integers(0, 64, n)
    pick[: n // 4] = 63  # a first stretch with nothing special in it
    cases = [
        0.0,
        -0.0,
        np.nan,
        np.inf,
        -np.inf,
        float(fi.max),
        -float(fi.max),
        float(fi.smallest_subnormal) * 3,
        -float(fi.tiny) / 2,
    ]
    for i, v in enumerate(cases):
        x[pick == i] = v
    return x.astype(dtype)


# --- streams against zfpy ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,rates", [(np.float32, F32_RATES), (np.float64, F64_RATES)])
def test_kernel_matches_zfpy(kernel, dtype, rates, x64):
    for rate in rates:
        for x in families(dtype, 1001, seed=4).values():
            assert_matches_zfpy(x, rate, CPU)


@pytest.mark.parametrize("dtype,rates", [(np.float32, F32_RATES), (np.float64, [8, 16, 40, 64])])
def test_special_values_match_zfpy(kernel, dtype, rates, x64):
    for seed, n in enumerate([4097, 999, 64 * 16 + 3]):
        x = specials(dtype, n, seed)
        for rate in rates:
            assert_matches_zfpy(x, rate, CPU)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype,rates", [(np.float32, ND_F32_RATES), (np.float64, [8, 16, 40, 64])])
def test_nd_special_values_match_zfpy(kernel, dims, dtype, rates, x64):
    """The 2-D/3-D coder (compiled per kernel) on the specials and on every partial block."""
    for seed, n in enumerate([4097, 999, 64 * 16 + 3]):
        x = specials(dtype, n, seed)
        for rate in rates:
            assert_matches_zfpy(x, rate, CPU, dims)
    x = families(dtype, 200, seed=3)["walk"]
    for n in range(1, 200):
        codec = Zfp(8, dims=dims)
        stream, finite = codec.encode_numpy(x[:n])
        ref_stream, ref_y = zfpy_roundtrip(x[:n], 8, dims)
        assert stream == ref_stream and finite, f"stream differs from zfpy: n={n} dims={dims}"
        np.testing.assert_array_equal(bits(codec.decode_numpy(stream, n, dtype)), bits(ref_y))


def lane_groups(n: int, dims: int, seed: int) -> np.ndarray:
    """A random walk over n values in which some 4^dims-value blocks hold what the 2-D/3-D lane
    coder hands to the scalar one (NaN, inf, exponents below -96), some are zeros or -0.0, some
    tiny or huge, so that lane groups of 8 and 16 blocks come whole, declined and partial."""
    rng = np.random.default_rng(seed)
    s = 4**dims
    x = np.cumsum(rng.standard_normal(n)) * rng.uniform(0.5, 2, n)
    for b in rng.choice(n // s, size=n // s // 5, replace=False):
        v = x[s * b : s * (b + 1)]
        kind = rng.integers(0, 7)
        if kind == 0:
            v[rng.integers(0, s)] = [np.nan, np.inf, -np.inf][rng.integers(0, 3)]
        elif kind == 1:
            v[:] = 0.0
        elif kind == 2:
            v[:] = -0.0
        elif kind == 3:
            v *= 2.0 ** rng.integers(-150, -100)  # subnormal or the smallest normals
        elif kind == 4:
            v *= 2.0 ** rng.integers(-100, -90)  # around the lane coder's lowest exponent
        elif kind == 5:
            v *= 2.0 ** rng.integers(100, 120)
        else:
            v[rng.integers(0, s)] = float(np.finfo(np.float32).max)
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(np.float32)


def nd_outputs(x, rate: float, dims: int, noise) -> tuple:
    """With the kernel JAXHC_ZFP_KERNEL names: x's stream, its decoded values, the finite flag,
    the values decoded from noise[0] and the fused decode-and-sum of noise."""
    n, dtype = x.size, x.dtype
    stream, y, ok = ours_roundtrip(x, rate, CPU, dims)
    fused, _ = _sum_fns(rate, n, dtype, dims)
    codec = Zfp(rate, dims=dims)
    decoded = np.asarray(jax.jit(lambda p: codec.decode(p, (n,), dtype))(noise[0]))
    return stream, bits(y), ok, bits(decoded), bits(np.asarray(fused(noise)))


@pytest.mark.parametrize("dims", quick([2, 3], {2}))  # 3-D lanes: `slow`, special values below
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, jnp.float16])
def test_nd_lanes_match_zfpy_and_the_scalar_coder(kernel, dims, dtype, monkeypatch):
    """The 2-D/3-D lane coder (float32, bfloat16 and float16 rows under avx512 and avx2) against
    zfpy's stream of the float32 values and against the portable scalar coder (the second
    oracle, forced by JAXHC_ZFP_KERNEL): streams, decoded values of the stream and of random
    bytes, the finite flag and the fused decode-and-sum, on whole and partial lane groups."""
    s = 4**dims
    n = s * (16 * 3 + 8 + 3) + 5
    x = lane_groups(n, dims, seed=dims)
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(dtype)
    rng = np.random.default_rng(dims)
    for rate in ND_F32_RATES:
        size = Zfp(rate, dims=dims).payload_bytes(n, dtype)
        noise = jnp.asarray(rng.integers(0, 256, (2, size), np.uint8))
        ours = nd_outputs(x, rate, dims, noise)
        monkeypatch.setenv("JAXHC_ZFP_KERNEL", "portable")
        scalar = nd_outputs(x, rate, dims, noise)
        monkeypatch.setenv("JAXHC_ZFP_KERNEL", kernel)
        where = f"rate={rate} dims={dims} {np.dtype(dtype).name}"
        assert ours[0] == scalar[0], f"stream differs from the scalar coder's: {where}"
        assert ours[0] == zfpy_roundtrip(x.astype(np.float32), rate, dims)[0], where
        assert ours[2] == scalar[2] == bool(np.isfinite(x.astype(np.float32)).all()), where
        for a, b in zip(ours[1:], scalar[1:], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize(
    "dtype,rate", [(np.float32, 8), (np.float32, 16), (np.float32, 5.5), (np.float64, 16)]
)
def test_all_lengths_match_zfpy_on_the_host(kernel, dtype, rate):
    """Every length 1..4099 through the host entry point (the handlers' kernels, no jit)."""
    codec = Zfp(rate)
    for family in ("magnitudes", "walk"):
        x = families(dtype, 4099, seed=2)[family]
        for n in range(1, 4100):
            stream, finite = codec.encode_numpy(x[:n])
            ref_stream, ref_y = zfpy_roundtrip(x[:n], rate)
            assert stream == ref_stream, f"stream differs from zfpy: n={n} rate={rate} {x.dtype}"
            y = codec.decode_numpy(stream, n, dtype)
            np.testing.assert_array_equal(bits(y), bits(ref_y), err_msg=f"n={n} rate={rate}")
            assert finite


@pytest.mark.parametrize("n,rate", [(1 << 20, 8), (3_000_001, 16), (1_000_003, 12.25)])
def test_long_rows_on_threads_match_zfpy(kernel, n, rate):
    rng = np.random.default_rng(n)
    x = (np.cumsum(rng.standard_normal(n)) * rng.uniform(0.5, 2, n)).astype(np.float32)
    assert_matches_zfpy(x, rate, CPU)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rate", [5.5, 8, 16, 32])
def test_narrow_types_code_their_float32_widening(kernel, dtype, rate):
    """bf16/f16 in: the stream of the values widened to float32; out: zfpy's decoded float32
    values rounded by jnp's astype."""
    narrow = jax.jit(lambda v: v.astype(dtype))
    for name, wide in {
        **families(np.float32, 1001, seed=5),
        "specials": specials(np.float32, 1001),
    }.items():
        with np.errstate(over="ignore", invalid="ignore"):
            x = wide.astype(dtype)
        stream, y, ok = ours_roundtrip(x, rate, CPU)
        ref_stream, ref_y = zfpy_roundtrip(x.astype(np.float32), rate)
        assert stream == ref_stream, f"{name}: stream differs from zfpy's of the widened values"
        assert y.dtype == dtype
        np.testing.assert_array_equal(bits(y), bits(np.asarray(narrow(ref_y))), err_msg=name)
        assert ok == bool(np.isfinite(x.astype(np.float32)).all())


# --- decode and sum in one pass ------------------------------------------------------------------


@functools.cache
def _sum_fns(rate: float, m: int, dtype, dims: int = 1):
    codec = Zfp(rate, dims=dims)
    fused = jax.jit(lambda p: codec.decode_sum(p, m, dtype))
    unfused = jax.jit(lambda p: Codec.decode_sum(codec, p, m, dtype))  # the generic path
    return fused, unfused


def payload_sets(codec: Zfp, parts: int, m: int, dtype, seed: int):
    """Payloads of real rows (the same values at other scales, so sums cancel and round) and of
    random bytes (every exponent, decoded values overflowing to ±inf that sum to NaN)."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.standard_normal(m))
    rows = np.stack([walk * rng.uniform(-2, 2) + rng.standard_normal(m) for _ in range(parts)])
    encoded = jax.vmap(codec.encode)(jnp.asarray(rows, dtype)).payload
    size = codec.payload_bytes(m, dtype)
    return {
        "encoded": encoded,
        "random": jnp.asarray(rng.integers(0, 256, (parts, size), np.uint8)),
    }


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, jnp.float16, np.float64])
@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_decode_sum_equals_decode_then_sum_in_rank_order(kernel, dtype, parts, x64):
    cases = [(8, 1, 1), (8, 1001, 1), (16, 4099, 1), (5.5, 70, 1), (8, 1001, 3), (8, 2100, 3)]
    for rate, m, dims in [*cases, (5.5, 4099, 2), (16, 777, 2)]:
        codec = Zfp(rate, dims=dims)
        fused, unfused = _sum_fns(rate, m, dtype, dims)
        for name, p in payload_sets(codec, parts, m, dtype, seed=parts).items():
            got, want = np.asarray(fused(p)), np.asarray(unfused(p))
            assert got.dtype == want.dtype == dtype and got.shape == (m,)
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{name} m={m}")


def test_decode_sum_rounds_each_value_before_adding(kernel):
    """Decode-then-add also where a product overflows and a fused multiply-add would not."""
    codec, n = Zfp(32), 1024
    payloads, want = fma_telling_payloads(n // 4)
    got = jax.jit(lambda p: codec.decode_sum(p, n, jnp.float32))(jnp.asarray(payloads))
    np.testing.assert_array_equal(bits(np.asarray(got)), bits(want))


def test_decode_sum_on_threads_and_under_vmap(kernel):
    """Rows long enough for several threads (whose flush-to-zero mode must be the caller's), and
    a batch of payload stacks under vmap equal to each stack alone."""
    codec, m = Zfp(8), 300_001
    fused, unfused = _sum_fns(8, m, np.float32)
    for p in payload_sets(codec, 3, m, np.float32, seed=7).values():
        np.testing.assert_array_equal(bits(np.asarray(fused(p))), bits(np.asarray(unfused(p))))
    stacks = jnp.stack(
        [payload_sets(codec, 2, 999, jnp.bfloat16, seed=s)["random"] for s in range(3)]
    )
    batched = jax.jit(jax.vmap(lambda p: codec.decode_sum(p, 999, jnp.bfloat16)))(stacks)
    for s in range(3):
        one = codec.decode_sum(stacks[s], 999, jnp.bfloat16)
        np.testing.assert_array_equal(bits(np.asarray(batched[s])), bits(np.asarray(one)))


# --- bad input -----------------------------------------------------------------------------------


def test_decode_sum_rejects_payloads_of_another_shape():
    codec = Zfp(8)
    with pytest.raises(ValueError, match=r"payloads must be uint8\[P, 16\] for 10 values"):
        codec.decode_sum(jnp.zeros((2, 24), jnp.uint8), 10, jnp.float32)
    with pytest.raises(ValueError, match="at least one payload"):
        codec.decode_sum(jnp.zeros((0, 16), jnp.uint8), 10, jnp.float32)
    with pytest.raises(ValueError, match="int32"):
        codec.decode_sum(jnp.zeros((2, 16), jnp.uint8), 10, jnp.int32)


@pytest.mark.parametrize("value,culprit", [("avx9", "not one of"), ("AVX512", "not one of")])
def test_unknown_kernel_name_is_an_error(monkeypatch, value, culprit):
    monkeypatch.setenv("JAXHC_ZFP_KERNEL", value)
    with pytest.raises(Exception, match=f"JAXHC_ZFP_KERNEL={value} .*{culprit}"):
        jax.block_until_ready(Zfp(8).encode(jnp.ones(8, jnp.float32)))
    with pytest.raises(ValueError, match=f"JAXHC_ZFP_KERNEL={value}"):
        Zfp(8).encode_numpy(np.ones(8, np.float32))
