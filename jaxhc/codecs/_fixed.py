"""Fixed-size lossy codecs run by native FFI targets: the encode/decode/decode_sum calls shared by
ZFP and the block quantizers."""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp

from jaxhc._compat import like
from jaxhc.codecs._base import Codec, Encoded, num_elements
from jaxhc.codecs._identity import _check_payload


class FixedSizeCodec(Codec):
    """A codec whose payload size depends on n and dtype only, encoded by the FFI targets
    ``jaxhc_<kernel>_encode`` (-> payload, ok: every value finite), ``jaxhc_<kernel>_decode`` and
    ``jaxhc_<kernel>_decode_sum`` (the rank-order sum of P payloads, bit for bit
    `Codec.decode_sum`), each taking the attributes `ffi_attrs(dtype)`."""

    #: The FFI target family, e.g. "zfp" for jaxhc_zfp_encode.
    kernel: str = ""
    lossless = False

    @abc.abstractmethod
    def ffi_attrs(self, dtype) -> dict:
        """The FFI call's attributes for values of `dtype` (checks the dtype)."""

    def encode_attrs(self, dtype) -> dict:
        """The encode call's attributes: `ffi_attrs` unless the encoder takes more."""
        return self.ffi_attrs(dtype)

    def encode(self, x: jax.Array) -> Encoded:
        flat = x.reshape(-1)
        n = flat.shape[0]
        if n == 0:
            raise ValueError(f"{self.kernel} cannot encode an empty array")
        size = self.payload_bytes(n, x.dtype)
        payload, ok = jax.ffi.ffi_call(
            f"jaxhc_{self.kernel}_encode",
            (jax.ShapeDtypeStruct((size,), jnp.uint8), jax.ShapeDtypeStruct((), jnp.bool_)),
            vmap_method="broadcast_all",
        )(flat, **self.encode_attrs(x.dtype))
        return like(Encoded(payload, ok, jnp.asarray(size, jnp.int32)), x)

    def decode(self, payload: jax.Array, shape, dtype) -> jax.Array:
        dtype = self.check_dtype(dtype)
        n = num_elements(shape)
        _check_payload(self, payload, self.payload_bytes(n, dtype))
        flat = jax.ffi.ffi_call(
            f"jaxhc_{self.kernel}_decode",
            jax.ShapeDtypeStruct((n,), dtype),
            vmap_method="broadcast_all",
        )(payload, **self.ffi_attrs(dtype))
        return like(flat, payload).reshape(shape)

    def decode_sum(self, payloads: jax.Array, n: int, dtype) -> jax.Array:
        """The values of the payloads (P, payload_bytes(n)) added in order 0..P-1: (n,) of dtype.

        Bit for bit `Codec.decode_sum` (decode each payload to `dtype`, add the rows in rank
        order in float32 (float64 stays float64), round to `dtype`), in one pass without the P
        decoded rows.

        >>> import jax.numpy as jnp
        >>> from jaxhc.codecs import Zfp
        >>> codec = Zfp(rate=8)
        >>> rows = jnp.stack([codec.encode(jnp.full(10, v, jnp.float32)).payload for v in (1, 2)])
        >>> codec.decode_sum(rows, 10, jnp.float32)[:3]
        Array([3., 3., 3.], dtype=float32)
        """
        dtype = self.check_dtype(dtype)
        n = self.check_payloads(payloads, n, dtype)
        total = jax.ffi.ffi_call(
            f"jaxhc_{self.kernel}_decode_sum",
            jax.ShapeDtypeStruct((n,), dtype),
            vmap_method="broadcast_all",
        )(payloads, **self.ffi_attrs(dtype))
        return like(total, payloads)
