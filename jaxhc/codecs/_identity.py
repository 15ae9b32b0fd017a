"""The identity codec: the array's own bytes, for "no compression" through the same code paths."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc.codecs._base import Codec, Encoded, num_elements


@dataclasses.dataclass(frozen=True)
class Identity(Codec):
    """No compression: the payload is the raw little-endian bytes of the flattened array.

    >>> from jaxhc.codecs import Identity
    >>> codec = Identity()                                  # the spec "none"
    >>> x = jnp.arange(4.0)
    >>> bool((codec.decode(codec.encode(x).payload, x.shape, x.dtype) == x).all())
    True
    """

    lossless = True
    fidelity = 3.0

    @property
    def spec(self) -> str:
        return "none"

    @property
    def may_fail(self) -> bool:
        return False

    def supports(self, dtype) -> bool:
        return jnp.dtype(dtype).itemsize > 0 and jnp.dtype(dtype) != jnp.bool_

    def payload_bytes(self, n: int, dtype) -> int:
        return int(n) * jnp.dtype(dtype).itemsize

    def encode(self, x: jax.Array) -> Encoded:
        dtype = self.check_dtype(x.dtype)
        del dtype
        payload = lax.bitcast_convert_type(x.reshape(-1), jnp.uint8).reshape(-1)
        nbytes = jnp.asarray(payload.shape[0], jnp.int32)
        return Encoded(payload, jnp.asarray(True), nbytes)

    def decode(self, payload: jax.Array, shape, dtype) -> jax.Array:
        dtype = self.check_dtype(dtype)
        n = num_elements(shape)
        _check_payload(self, payload, self.payload_bytes(n, dtype))
        if dtype.itemsize == 1:
            flat = lax.bitcast_convert_type(payload, dtype)
        else:
            flat = lax.bitcast_convert_type(payload.reshape(n, dtype.itemsize), dtype)
        return flat.reshape(shape)


def _check_payload(codec: Codec, payload: jax.Array, expected: int) -> None:
    if payload.dtype != jnp.uint8 or payload.ndim != 1 or payload.shape[0] != expected:
        raise ValueError(
            f"codec {codec.spec!r}: payload must be uint8[{expected}], "
            f"got {payload.dtype}{list(payload.shape)}"
        )
