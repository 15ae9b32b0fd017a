"""MPC lossless codec (Yang, Mukka, Hesaaraki, Burtscher 2015) as XLA FFI custom calls."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxhc import _native
from jaxhc._compat import like
from jaxhc.codecs._base import Codec, Encoded, NativeCall, num_elements
from jaxhc.codecs._identity import _check_payload

MAX_DIM = 64


@dataclasses.dataclass(frozen=True)
class Mpc(Codec):
    """Lossless MPC over the flattened array's bits: exact for every bit pattern.

    Pipeline per chunk of 1024 words: subtract the word ``dim`` positions earlier, transpose bits,
    subtract the previous word, drop zero words (a one-bit-per-word bitmap keeps their places).
    The compressed size depends on the data, but XLA needs a static one: the payload has room for
    ``budget`` x raw bytes (``budget=None``: the worst case, so every input fits). ``Encoded.ok``
    says whether the data fit; a payload that did not fit must not be decoded. A malformed payload
    makes ``decode`` raise on CPU; on CUDA it decodes to zeros (errors cannot leave the stream).

    >>> import jax.numpy as jnp
    >>> from jaxhc.codecs import Mpc
    >>> x = jnp.arange(4096, dtype=jnp.float32)
    >>> enc = Mpc(budget=0.8).encode(x)
    >>> bool(enc.ok), int(enc.nbytes) < x.nbytes
    (True, True)
    >>> bool((Mpc(budget=0.8).decode(enc.payload, x.shape, x.dtype) == x).all())
    True
    """

    dim: int = 1
    budget: float | None = None
    lossless = True
    fidelity = 2.0

    def __post_init__(self):
        if (
            isinstance(self.dim, bool)
            or not isinstance(self.dim, int)
            or not 1 <= self.dim <= MAX_DIM
        ):
            raise ValueError(f"mpc dim {self.dim!r} must be an integer in 1..{MAX_DIM}")
        b = self.budget
        if b is not None and (
            isinstance(b, bool)
            or not isinstance(b, (int, float))
            or not 0 < b <= 2
            or math.isnan(b)
        ):
            raise ValueError(f"mpc budget {b!r} must be a fraction of the raw size in (0, 2]")

    @property
    def spec(self) -> str:
        s = "mpc" if self.budget is None else f"mpc:{self.budget:g}"
        return s if self.dim == 1 else f"{s}:dim={self.dim}"

    @property
    def may_fail(self) -> bool:
        """Only a budget can be exceeded: the worst-case payload fits every input."""
        return self.budget is not None

    def native_call(self, dtype) -> NativeCall | None:
        self.check_dtype(dtype)
        return NativeCall("mpc", 0, self.dim, self.budget or 0.0)

    def payload_bytes(self, n: int, dtype) -> int:
        word = self.check_dtype(dtype).itemsize
        worst = int(_native.cpu.mpc_max_payload_bytes(int(n), word))
        if self.budget is None:
            return worst
        floor = int(_native.cpu.mpc_header_bytes(int(n), word))
        want = -(-math.ceil(self.budget * n * word) // 8) * 8
        return min(worst, max(floor, want))

    def encode(self, x: jax.Array) -> Encoded:
        dtype = self.check_dtype(x.dtype)
        flat = x.reshape(-1)
        n = flat.shape[0]
        if n == 0:
            raise ValueError("mpc cannot encode an empty array")
        capacity = self.payload_bytes(n, dtype)
        scratch = int(_native.cpu.mpc_scratch_bytes(n, dtype.itemsize))
        payload, nbytes, _ = jax.ffi.ffi_call(
            "jaxhc_mpc_encode",
            (
                jax.ShapeDtypeStruct((capacity,), jnp.uint8),
                jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((scratch,), jnp.uint8),
            ),
            vmap_method="broadcast_all",
        )(flat, dim=self.dim)
        return like(Encoded(payload, nbytes <= capacity, nbytes), x)

    def decode(self, payload: jax.Array, shape, dtype) -> jax.Array:
        dtype = self.check_dtype(dtype)
        n = num_elements(shape)
        _check_payload(self, payload, self.payload_bytes(n, dtype))
        flat, status = decode_flat(payload, n, dtype, self.dim, strict=True)
        flat = lax.platform_dependent(flat, status, cpu=lambda f, _: f, default=checked_on_host)
        return flat.reshape(shape)


def decode_flat(payload: jax.Array, n: int, dtype, dim: int, *, strict: bool):
    """Decode MPC payloads (uint8[..., capacity]) into dtype[..., n] and a status (int32[...]).

    The codec moves bits only: ``dtype`` may be any 16, 32 or 64-bit int or float type.
    The status is 0 for a good row; a malformed row decodes to zeros with a nonzero status
    (see ``Status`` in ffi/core/mpc.h; `status_message` says it in words). With ``strict`` the
    CPU decoder also raises for the first bad row; the CUDA decoder never raises, it only reports
    the status.
    """
    out = jax.ffi.ffi_call(
        "jaxhc_mpc_decode",
        (
            jax.ShapeDtypeStruct((n,), dtype),
            jax.ShapeDtypeStruct((), jnp.int32),
        ),
        vmap_method="broadcast_all",
    )(payload, dim=dim, strict=int(strict))
    return like(out, payload)


def status_message(status: int) -> str:
    """What a nonzero decode status (``decode_flat``) means, in words."""
    return _native.cpu.mpc_status_message(int(status))


def raise_if_malformed(status) -> np.ndarray:
    """Raise a ValueError naming the first row whose decode status is nonzero; else zeros."""
    status = np.asarray(status)
    bad = np.flatnonzero(status.reshape(-1))
    if bad.size:
        row = int(bad[0])
        where = f"row {row}" if status.ndim else "the payload"
        raise ValueError(f"mpc decode: {where}: {status_message(status.reshape(-1)[row])}")
    return np.zeros(status.shape, np.uint8)


def checked_on_host(flat: jax.Array, status: jax.Array) -> jax.Array:
    """`flat` (1-D) once a host callback has checked `status` (raising for a malformed row).

    The check runs wherever the computation runs (on a GPU it costs a device-to-host copy of the
    status per call). The callback returns zeros, XOR-ed into the first word of `flat` so that
    XLA can neither drop the check nor let the result be used without it.
    """
    zero = jax.pure_callback(
        raise_if_malformed,
        jax.ShapeDtypeStruct(status.shape, jnp.uint8),
        status,
        vmap_method="broadcast_all",
    )
    word = jnp.dtype(f"uint{8 * flat.dtype.itemsize}")
    first = lax.bitcast_convert_type(flat[:1], word) ^ zero.astype(word)
    return flat.at[:1].set(lax.bitcast_convert_type(first, flat.dtype))
