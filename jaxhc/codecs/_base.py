"""The codec interface every collective uses: static payload sizes, jit/vmap-able encode/decode."""

from __future__ import annotations

import abc
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxhc._sum import sum_in_rank_order

FLOAT_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


class Encoded(NamedTuple):
    """What `Codec.encode` returns (a pytree, so it passes through jit, vmap and collectives).

    payload: uint8[..., payload_bytes] -- the bytes a transport moves; its size is static.
    ok:      bool[...] -- the payload decodes within the codec's promise: for a lossy codec the
             input was finite (rotated q8:h/q4:h: and below 2^116 in magnitude), for a budgeted
             lossless codec the data fit the budget. Collectives fall back to raw transfer
             for the whole call when any participant is not ok.
    nbytes:  int32[...] -- bytes of the payload that carry data (all of it for fixed-rate codecs).

    >>> enc = jaxhc.codecs.Identity().encode(jnp.arange(4.0))
    >>> enc.payload.dtype, enc.payload.shape, bool(enc.ok), int(enc.nbytes)
    (dtype('uint8'), (16,), True, 16)
    """

    payload: jax.Array
    ok: jax.Array
    nbytes: jax.Array


class NativeCall(NamedTuple):
    """How the native MPI engine codes a codec in one fused call (`Codec.native_call`).

    family: "zfp", "mpc", "quant" (absmax blocks) or "quant:h" (rotated blocks); maxbits: ZFP's
    bits per block; dim: ZFP's dimensions or MPC's word stride; budget: MPC's payload budget as a
    fraction of the raw bytes (0: none); bits, block: a quantizer's bits per code and values per
    block. Fields a family does not use are 0.

    >>> from jaxhc.codecs import parse
    >>> parse("zfp:8").native_call(jnp.float32)
    NativeCall(family='zfp', maxbits=32, dim=1, budget=0.0, bits=0, block=0)
    >>> parse("q4:h").native_call(jnp.bfloat16)
    NativeCall(family='quant:h', maxbits=0, dim=0, budget=0.0, bits=4, block=256)
    >>> parse("q8:sr").native_call(jnp.float32) is None    # not taken by the fused engine
    True
    """

    family: str
    maxbits: int
    dim: int
    budget: float
    bits: int = 0
    block: int = 0


class Codec(abc.ABC):
    """A compressor for one flattened array (subclasses are frozen, hashable dataclasses).

    >>> from jaxhc.codecs import Codec, parse
    >>> [isinstance(parse(s), Codec) for s in ("none", "zfp:8", "q8", "mpc")]
    [True, True, True, True]
    >>> zfp = parse("zfp:8")
    >>> zfp.lossless, parse("mpc").lossless, zfp.payload_bytes(1000, jnp.float32)
    (False, True, 1000)
    """

    #: True when decode(encode(x)) == x bit for bit.
    lossless: bool
    #: A message cut into parts at multiples of this many values has each part coded as the
    #: whole message codes those values (a lossy codec's result for a value depends on the other
    #: values of its block); 0: no cut keeps them (e.g. rounding keyed by a value's index).
    segment_values: int = 1
    #: The dtypes it compresses (`supports`, `check_dtype`).
    dtypes = FLOAT_DTYPES
    #: Values per independently coded block: a bucket of several tensors aligns each tensor to
    #: it so that no block mixes two of them (1: no alignment needed).
    block_values: int = 1
    #: Where `jaxhc.policy` must choose between codecs for the same traffic, the higher wins
    #: (closer to raw values); no compression at all ranks above every codec.
    fidelity: float = 0.0

    @property
    def may_fail(self) -> bool:
        """Whether `encode` can report not ok (a collective then needs an agreement round)."""
        return True

    def native_call(self, dtype) -> NativeCall | None:
        """The fused native MPI call that codes this codec for `dtype`, or None where the MPI
        transport runs jaxhc's own algorithm (encode, move the payloads, decode) instead."""
        del dtype
        return None

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """The string `jaxhc.codecs.parse` turns back into this codec, e.g. ``"zfp:8"``."""

    @abc.abstractmethod
    def payload_bytes(self, n: int, dtype) -> int:
        """Static size in bytes of the payload of `n` values of `dtype`."""

    @abc.abstractmethod
    def encode(self, x: jax.Array) -> Encoded:
        """Encode the flattened `x` into a payload of `payload_bytes(x.size, x.dtype)` bytes."""

    @abc.abstractmethod
    def decode(self, payload: jax.Array, shape, dtype) -> jax.Array:
        """Decode a payload written by `encode` for an array of `shape` and `dtype`."""

    def decode_sum(self, payloads: jax.Array, n: int, dtype) -> jax.Array:
        """The values of the payloads (P, payload_bytes(n)) added in order 0..P-1: (n,) of dtype.

        Each row is decoded to `dtype`, the rows are added in rank order in float32 (float64
        stays float64) and the sum is rounded to `dtype`: the reduction of the compressed
        collectives (`jaxhc._sum.sum_in_rank_order` with ``wide16=True``). Codecs with a fused
        kernel (ZFP) override it with the same result.
        """
        rows = jax.vmap(lambda p: self.decode(p, (n,), dtype))(payloads)
        return sum_in_rank_order(rows, wide16=True)

    def check_payloads(self, payloads: jax.Array, n, dtype) -> int:
        """Check the (P, payload_bytes(n)) payloads of `decode_sum`, P >= 1; returns int(n)."""
        n = int(n)
        size = self.payload_bytes(n, dtype)
        if payloads.dtype != jnp.uint8 or payloads.ndim != 2 or payloads.shape[1] != size:
            raise ValueError(
                f"codec {self.spec!r}: payloads must be uint8[P, {size}] for {n} values, "
                f"got {payloads.dtype}{list(payloads.shape)}"
            )
        if payloads.shape[0] == 0:
            raise ValueError(f"codec {self.spec!r}: decode_sum needs at least one payload")
        return n

    def supports(self, dtype) -> bool:
        """Whether this codec compresses `dtype` (collectives send other dtypes raw)."""
        return jnp.dtype(dtype) in [jnp.dtype(d) for d in self.dtypes]

    def check_dtype(self, dtype) -> np.dtype:
        dtype = jnp.dtype(dtype)
        if not self.supports(dtype):
            names = [jnp.dtype(d).name for d in self.dtypes]
            raise ValueError(
                f"codec {self.spec!r} cannot encode dtype {dtype}: "
                f"it takes {', '.join(names[:-1])} or {names[-1]}"
            )
        return dtype

    def __str__(self) -> str:
        return self.spec


def num_elements(shape) -> int:
    return math.prod(int(d) for d in shape)
