"""ZFP fixed-rate 1-D codec (lossy) over the flattened array, as XLA FFI custom calls."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxhc import _native
from jaxhc.codecs._fixed import FixedSizeCodec

# zfp's exponent bits per block (a block must hold at least 1 + EBITS bits).
_EBITS = {jnp.dtype(jnp.float32): 8, jnp.dtype(jnp.float64): 11}
_MAX_RATE = {jnp.dtype(jnp.float32): 32, jnp.dtype(jnp.float64): 64}
MIN_RATE = 3


@dataclasses.dataclass(frozen=True)
class Zfp(FixedSizeCodec):
    """Fixed-rate ZFP: each block of 4 consecutive values is coded in exactly round(4 * rate) bits.

    The stream of a 1-D float32/float64 array is byte-identical to
    ``zfpy.compress_numpy(x, rate=rate, write_header=False)``. bfloat16/float16 values are coded
    as their float32 widening (inside the kernel: no widened copy) and decoded values rounded as
    ``astype`` does. Rates: 3..32 bits/value for float32 (and the narrow types), 3..64 for
    float64; zfp rounds a fractional rate to a multiple of 1/4.

    >>> import jax.numpy as jnp
    >>> from jaxhc.codecs import Zfp
    >>> codec = Zfp(rate=8)
    >>> enc = codec.encode(jnp.linspace(0, 1, 1000, dtype=jnp.float32))
    >>> enc.payload.shape, bool(enc.ok)
    ((1000,), True)
    >>> y = codec.decode(enc.payload, (1000,), jnp.float32)
    """

    rate: float
    kernel = "zfp"

    def __post_init__(self):
        rate = self.rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
            raise ValueError(f"zfp rate {rate!r} is not a finite number of bits per value")
        if not MIN_RATE <= rate <= max(_MAX_RATE.values()):
            raise ValueError(
                f"zfp rate {rate!r} is out of range: use 3..32 (float32) or 3..64 (float64)"
            )

    @property
    def spec(self) -> str:
        return f"zfp:{self.rate:g}"

    def coded_dtype(self, dtype) -> jnp.dtype:
        """The float type the stream codes: float64 stays, any other float is widened to float32."""
        dtype = self.check_dtype(dtype)
        coded = jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)
        if self.rate > _MAX_RATE[coded]:
            raise ValueError(
                f"zfp rate {self.rate:g} is out of range for {dtype}: "
                f"use {MIN_RATE}..{_MAX_RATE[coded]} bits per value"
            )
        return coded

    def maxbits(self, dtype) -> int:
        """Bits per 4-value block, rounded and clamped as zfp_stream_set_rate does."""
        coded = self.coded_dtype(dtype)
        return max(int(math.floor(4 * self.rate + 0.5)), 1 + _EBITS[coded])

    def payload_bytes(self, n: int, dtype) -> int:
        return int(_native.cpu.zfp_payload_bytes(int(n), self.maxbits(dtype)))

    def ffi_attrs(self, dtype) -> dict:
        return {"maxbits": self.maxbits(dtype)}

    def encode_numpy(self, x) -> tuple[bytes, bool]:
        """Host (numpy) encode of a 1-D float32/float64 array: (stream, all finite).

        The same kernels and stream as `encode`, without jax: zfpy's
        ``compress_numpy(x, rate, write_header=False)``, only faster.
        """
        x = np.ascontiguousarray(x).reshape(-1)
        dtype = self.coded_dtype(x.dtype)
        if x.dtype != dtype:
            raise ValueError(f"encode_numpy takes float32 or float64 values, got {x.dtype}")
        return _native.cpu.zfp_encode(x, self.maxbits(dtype))

    def decode_numpy(self, stream: bytes, n: int, dtype) -> np.ndarray:
        """Host (numpy) decode of `n` values of `dtype` (float32 or float64) from `stream`."""
        dtype = self.coded_dtype(dtype)
        if dtype != jnp.dtype(jnp.float64) and dtype != jnp.dtype(jnp.float32):
            raise ValueError(f"decode_numpy gives float32 or float64 values, not {dtype}")
        return _native.cpu.zfp_decode(stream, int(n), dtype == jnp.float64, self.maxbits(dtype))
