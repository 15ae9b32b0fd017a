"""ZFP fixed-rate codec (lossy) over the flattened array in 1-D, 2-D or 3-D blocks, as XLA FFI
custom calls."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxhc import _native
from jaxhc.codecs._base import NativeCall
from jaxhc.codecs._fixed import FixedSizeCodec

# zfp's exponent bits per block (a block must hold at least 1 + EBITS bits).
_EBITS = {jnp.dtype(jnp.float32): 8, jnp.dtype(jnp.float64): 11}
_MAX_RATE = {jnp.dtype(jnp.float32): 32, jnp.dtype(jnp.float64): 64}
# The lowest rate per block dims: at least the exponent's bits per block, and where zfpy (the
# oracle) still writes a sound stream (it corrupts memory for 1-D float rates below 2.25).
MIN_RATE = {1: 3, 2: 1, 3: 1}
DIMS = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class Zfp(FixedSizeCodec):
    """Fixed-rate ZFP: each block of 4^dims consecutive values is coded in exactly
    round(4^dims * rate) bits.

    dims 1 (spec ``zfp:8``): the stream of a 1-D float32/float64 array is byte-identical to
    ``zfpy.compress_numpy(x, rate=rate, write_header=False)``. dims 2 and 3 (``zfp:8:d2``,
    ``zfp:8:d3``): the n values are laid out as the array (ceil(n/4), 4) or (ceil(n/16), 4, 4),
    so each 4x4 or 4x4x4 block of zfp's 2-D/3-D coder is 16 or 64 consecutive values, and the
    stream is zfpy's of that array, its last row (and in 3-D its last 4x4 plane) completed as zfp
    pads a partial block (ffi/core/zfp_nd.h). One exponent per 16 or 64 values and the
    decorrelating transform over more values make the 3-D coder several times more accurate per
    bit than the 1-D one on gradients. bfloat16/float16 values are coded as their float32
    widening (inside the kernel: no widened copy) and decoded values rounded as ``astype`` does.
    Rates: 3 (1-D) or 1 (2-D/3-D) up to 32 bits/value for float32 (and the narrow types), 64
    for float64; zfp rounds a fractional rate to a multiple of 1/4^dims.

    >>> import jax.numpy as jnp
    >>> from jaxhc.codecs import Zfp
    >>> codec = Zfp(rate=8)
    >>> enc = codec.encode(jnp.linspace(0, 1, 1000, dtype=jnp.float32))
    >>> enc.payload.shape, bool(enc.ok)
    ((1000,), True)
    >>> y = codec.decode(enc.payload, (1000,), jnp.float32)
    """

    rate: float
    dims: int = 1
    kernel = "zfp"

    def __post_init__(self):
        rate, dims = self.rate, self.dims
        if isinstance(dims, bool) or dims not in DIMS:
            raise ValueError(f"zfp dims {dims!r} must be 1, 2 or 3")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
            raise ValueError(f"zfp rate {rate!r} is not a finite number of bits per value")
        low = MIN_RATE[dims]
        if not low <= rate <= max(_MAX_RATE.values()):
            raise ValueError(
                f"zfp rate {rate!r} is out of range in {dims}-D: "
                f"use {low}..32 (float32) or {low}..64 (float64)"
            )

    @property
    def spec(self) -> str:
        return f"zfp:{self.rate:g}" + (f":d{self.dims}" if self.dims > 1 else "")

    def coded_dtype(self, dtype) -> jnp.dtype:
        """The float type the stream codes: float64 stays, any other float is widened to float32."""
        dtype = self.check_dtype(dtype)
        coded = jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)
        if self.rate > _MAX_RATE[coded]:
            raise ValueError(
                f"zfp rate {self.rate:g} is out of range for {dtype}: "
                f"use {MIN_RATE[self.dims]}..{_MAX_RATE[coded]} bits per value"
            )
        return coded

    @property
    def block_values(self) -> int:
        """Values per block: 4, 16 or 64."""
        return 4**self.dims

    @property
    def segment_values(self) -> int:
        return self.block_values

    def maxbits(self, dtype) -> int:
        """Bits per block, rounded and clamped as zfp_stream_set_rate does."""
        coded = self.coded_dtype(dtype)
        return max(int(math.floor(self.block_values * self.rate + 0.5)), 1 + _EBITS[coded])

    @property
    def fidelity(self) -> float:
        return 1.0 + self.rate / 1000.0 + self.dims / 1e6

    def native_call(self, dtype) -> NativeCall | None:
        return NativeCall("zfp", self.maxbits(dtype), self.dims, 0.0)

    def payload_bytes(self, n: int, dtype) -> int:
        return int(_native.cpu.zfp_payload_bytes(int(n), self.maxbits(dtype), self.dims))

    def ffi_attrs(self, dtype) -> dict:
        return {"maxbits": self.maxbits(dtype), "dims": self.dims}

    def encode_numpy(self, x) -> tuple[bytes, bool]:
        """Host (numpy) encode of a float32/float64 array, flattened: (stream, all finite).

        The same kernels and stream as `encode`, without jax: in 1-D zfpy's
        ``compress_numpy(x, rate, write_header=False)``, only faster.
        """
        x = np.ascontiguousarray(x).reshape(-1)
        dtype = self.coded_dtype(x.dtype)
        if x.dtype != dtype:
            raise ValueError(f"encode_numpy takes float32 or float64 values, got {x.dtype}")
        return _native.cpu.zfp_encode(x, self.maxbits(dtype), self.dims)

    def decode_numpy(self, stream: bytes, n: int, dtype) -> np.ndarray:
        """Host (numpy) decode of `n` values of `dtype` (float32 or float64) from `stream`."""
        dtype = self.coded_dtype(dtype)
        if dtype != jnp.dtype(jnp.float64) and dtype != jnp.dtype(jnp.float32):
            raise ValueError(f"decode_numpy gives float32 or float64 values, not {dtype}")
        f64 = dtype == jnp.float64
        return _native.cpu.zfp_decode(stream, int(n), f64, self.maxbits(dtype), self.dims)
