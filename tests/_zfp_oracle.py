"""The zfpy oracle and our ZFP codec side by side, for the ZFP tests."""

from __future__ import annotations

import functools

import jax
import numpy as np
import zfpy

from jaxhc.codecs import Zfp

F32_RATES = [3, 4, 5.5, 8, 12.25, 16, 24, 32]
F64_RATES = F32_RATES + [40, 64]


def zfpy_roundtrip(x: np.ndarray, rate: float) -> tuple[bytes, np.ndarray]:
    stream = zfpy.compress_numpy(x, rate=rate, write_header=False)
    y = zfpy._decompress(stream, zfpy.dtype_to_ztype(x.dtype), list(x.shape), rate=rate)
    return stream, np.asarray(y)


@functools.lru_cache(maxsize=64)
def _roundtrip_fn(rate: float, shape: tuple, dtype):
    codec = Zfp(rate=rate)

    def roundtrip(x):
        e = codec.encode(x)
        return e.payload, e.ok, codec.decode(e.payload, shape, dtype)

    return jax.jit(roundtrip)


def ours_roundtrip(x: np.ndarray, rate: float, device) -> tuple[bytes, np.ndarray, bool]:
    payload, ok, y = _roundtrip_fn(rate, x.shape, x.dtype)(jax.device_put(x, device))
    return np.asarray(payload).tobytes(), np.asarray(y), bool(ok)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_matches_zfpy(x: np.ndarray, rate: float, device) -> None:
    stream, y, ok = ours_roundtrip(x, rate, device)
    ref_stream, ref_y = zfpy_roundtrip(x, rate)
    assert stream == ref_stream, f"stream differs from zfpy: n={x.size} rate={rate} {x.dtype}"
    np.testing.assert_array_equal(bits(y), bits(ref_y), err_msg=f"n={x.size} rate={rate}")
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
