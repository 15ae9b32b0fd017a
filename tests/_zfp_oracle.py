"""The zfpy oracle and our ZFP codec side by side, for the ZFP tests."""

from __future__ import annotations

import functools

import jax
import numpy as np
import zfpy

from jaxhc.codecs import Zfp

F32_RATES = [3, 4, 5.5, 8, 12.25, 16, 24, 32]
F64_RATES = F32_RATES + [40, 64]
# 2-D/3-D: every 1-D rate, and rates below 3 too (zfpy writes sound streams down to 1 bit per
# value there).
ND_F32_RATES = [1, 2.5, *F32_RATES]
ND_F64_RATES = ND_F32_RATES + [40, 64]


def _pad_last_axis(v: np.ndarray) -> np.ndarray:
    """zfp's pad_block on a last axis of m < 4 values: v1 = v0 (m = 1), v2 = v1, v3 = v0."""
    m = v.shape[-1]
    out = np.empty(v.shape[:-1] + (4,), v.dtype)
    out[..., :m] = v
    if m < 2:
        out[..., 1] = out[..., 0]
    if m < 3:
        out[..., 2] = out[..., 1]
    out[..., 3] = out[..., 0] if m < 4 else out[..., 3]
    return out


def layout(x: np.ndarray, dims: int) -> np.ndarray:
    """The array zfpy codes for our dims-D stream of the 1-D x: (ceil(n/4), 4) or
    (ceil(n/16), 4, 4), the last row completed along x and the last 4x4 plane along y as zfp
    pads a partial block (zfp itself pads the last blocks along y or z)."""
    if dims == 1:
        return x
    n, whole = x.size, x.size // 4 * 4
    rows = x[:whole].reshape(-1, 4)
    if n % 4:
        rows = np.concatenate([rows, _pad_last_axis(x[whole:])[None]])
    if dims == 2:
        return rows
    r, whole = rows.shape[0], rows.shape[0] // 4 * 4
    planes = rows[:whole].reshape(-1, 4, 4)
    if r % 4:
        planes = np.concatenate([planes, _pad_last_axis(rows[whole:].T).T[None]])
    return planes


def zfpy_roundtrip(x: np.ndarray, rate: float, dims: int = 1) -> tuple[bytes, np.ndarray]:
    """zfpy's stream of x (in our dims-D layout) and its decompression, as the 1-D x."""
    a = layout(x, dims)
    stream = zfpy.compress_numpy(a, rate=rate, write_header=False)
    y = zfpy._decompress(stream, zfpy.dtype_to_ztype(a.dtype), list(a.shape), rate=rate)
    return stream, np.asarray(y).reshape(-1)[: x.size].reshape(x.shape)


@functools.lru_cache(maxsize=64)
def _roundtrip_fn(rate: float, shape: tuple, dtype, dims: int):
    codec = Zfp(rate=rate, dims=dims)

    def roundtrip(x):
        e = codec.encode(x)
        return e.payload, e.ok, codec.decode(e.payload, shape, dtype)

    return jax.jit(roundtrip)


def ours_roundtrip(
    x: np.ndarray, rate: float, device, dims: int = 1
) -> tuple[bytes, np.ndarray, bool]:
    payload, ok, y = _roundtrip_fn(rate, x.shape, x.dtype, dims)(jax.device_put(x, device))
    return np.asarray(payload).tobytes(), np.asarray(y), bool(ok)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_matches_zfpy(x: np.ndarray, rate: float, device, dims: int = 1) -> None:
    stream, y, ok = ours_roundtrip(x, rate, device, dims)
    ref_stream, ref_y = zfpy_roundtrip(x, rate, dims)
    where = f"n={x.size} rate={rate} {x.dtype} dims={dims}"
    assert stream == ref_stream, f"stream differs from zfpy: {where}"
    np.testing.assert_array_equal(bits(y), bits(ref_y), err_msg=where)
    assert ok == bool(np.isfinite(x).all())


def families(dtype, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    fi = np.finfo(dtype)
    t = np.arange(n)
    with np.errstate(over="ignore", under="ignore"):
        out = {
            "smooth": np.sin(t * 0.01) * 100 + np.cos(t * 0.003),
            "walk": np.cumsum(rng.standard_normal(n)),
            "noisy": rng.standard_normal(n),
            "constant": np.full(n, 3.25),
            "magnitudes": rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n),
            "denormals": rng.integers(-(2**20), 2**20, n) * float(fi.smallest_subnormal),
            "tiny": rng.standard_normal(n) * float(fi.tiny) * 2.0 ** rng.integers(-20, 40, n),
            "huge": rng.standard_normal(n) * float(fi.max) / 4,
            "zeros": np.zeros(n),
            "negzeros": np.full(n, -0.0),
        }
        return {k: v.astype(dtype) for k, v in out.items()}


def fma_telling_payloads(blocks: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two zfp:32 float32 payloads (4 * blocks values, 128-bit blocks) that tell a decode-and-sum
    rounding each decoded value before adding from one fusing the last product into the add (an
    FMA). Part 0 decodes to values up to 2^128 (block exponent 127), part 1 to integers times 2^98
    (exponent 128), many beyond the largest float32, so inf. Returns the payloads uint8[2, bytes]
    and their decoded values added (zfpy's decoder: float32, rounded, then added). A fused sum,
    part 1's exact products (twice its values at exponent 127) plus part 0 rounded once, is
    finite in places where that is inf (checked here, so a test with these can fail)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**63, (2, blocks, 2), dtype=np.uint64)

    def with_exponent(w, e):  # block head: a 1 (nonzero block), then 8 exponent bits
        w = w.copy()
        w[:, 0] = (w[:, 0] & ~np.uint64(0x1FF)) | np.uint64(1 | e << 1)
        return w.reshape(-1).view(np.uint8)

    payloads = np.stack([with_exponent(words[0], 254), with_exponent(words[1], 255)])
    shape = [4 * blocks]
    ztype = zfpy.dtype_to_ztype(np.dtype(np.float32))

    def decode(p):
        return np.asarray(zfpy._decompress(p.tobytes(), ztype, shape, rate=32))

    part0, part1, half = (
        decode(payloads[0]),
        decode(payloads[1]),
        decode(with_exponent(words[1], 254)),
    )
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = part0 + part1
        fused = np.where(np.isfinite(half), part0 + 2 * half.astype(np.float64), np.nan)
        assert (np.isinf(rounded) & np.isfinite(fused.astype(np.float32))).any()
    return payloads, rounded
