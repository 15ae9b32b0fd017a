"""Shared machinery of the compressed collectives: codec choice, rows, agreement, accounting."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc import accounting, context
from jaxhc._compat import axis_tuple, check_vma_enabled, linear_call, make_varying
from jaxhc.codecs import Codec, CodecLike, parse
from jaxhc.collectives import volume
from jaxhc.transport import current as transport


def resolve(x, axis_name, codec: CodecLike, policy, kind) -> Codec | None:
    """The codec this call compresses with, or None for the plain collective.

    `codec` (a Codec, spec string, or None) and `policy` (a Policy, preset name or YAML path) are
    alternatives; given neither, the call takes the policy of `jaxhc.context` (None there: plain).
    Non-float dtypes and, under a policy, messages smaller than its ``min_bytes`` go
    uncompressed. A policy picks the codec for x's dtype, and a lossy one that would send no fewer
    bits than x itself is a one-line error naming its key.

    >>> from jaxhc.collectives import resolve_codec
    >>> big, small = jnp.ones(1 << 17), jnp.ones(10)      # min_bytes of the presets: 65536
    >>> resolve_codec(big, "data", None, "zhybrid", "grad"), resolve_codec(small, "data", None,
    ...                                                                   "zhybrid", "grad")
    (Zfp(rate=8.0, dims=1), None)
    >>> resolve_codec(jnp.arange(10), "data", "zfp:8", None, None) is None   # integers: raw
    True
    """
    if codec is not None and policy is not None:
        raise ValueError("pass either codec= or policy=, not both")
    if codec is not None:
        policy, chosen, min_bytes = None, parse(codec), 0
    else:
        policy = context.policy() if policy is None else context.as_policy(policy)
        if policy is None:
            return None
        chosen, min_bytes = policy.codec_for(axis_name, kind, x.dtype), policy.min_bytes
    if chosen is None or not chosen.supports(x.dtype):
        return None
    if x.size * jnp.dtype(x.dtype).itemsize < min_bytes:
        return None
    if policy is not None:
        policy.check_saving(axis_name, kind, x.dtype)
    return chosen


def as_array(x) -> jax.Array:
    """A Python or numpy scalar (or array) as a jax array, weak-typed as `jax.lax` takes it."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def python_number(x) -> bool:
    """A Python int / float / complex (not bool): `jax.lax.psum` folds these at trace time."""
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool)


def linear(x, forward, transpose):
    """`forward(x)`, a collective that is linear up to its codec, differentiable in both modes.

    Forward mode (`jax.jvp`, `jax.linearize`) sends the tangent through `forward` as well, so it
    travels like the primal (compressed by the same codec); reverse mode sends the cotangent
    through `transpose` (the conjugate collective). A `custom_jvp` whose tangent is a
    `linear_call`: jax transposes that with `transpose`, which a `custom_vjp` cannot offer.
    On the MPI transport a `custom_vjp` (reverse mode only): mpi4jax's ordered effects cannot be
    lowered inside a `linear_call` (jax 0.10: KeyError on the effect's token).
    """
    if transport().name == "mpi":
        return _reverse_only(x, forward, transpose)

    @jax.custom_jvp
    def collective(a):
        return forward(a)

    @collective.defjvp
    def _jvp(primals, tangents):
        (a,), (t,) = primals, tangents
        tangent = linear_call(lambda _, u: forward(u), lambda _, ct: transpose(ct), (), t)
        return collective(a), tangent

    return collective(x)


def _reverse_only(x, forward, transpose):
    @jax.custom_vjp
    def collective(a):
        return forward(a)

    collective.defvjp(lambda a: (forward(a), None), lambda _, ct: (transpose(ct),))
    return collective(x)


def differentiable(x) -> bool:
    """Float inputs go through jaxhc's `linear` even uncompressed, so the ledger sees backward
    traffic too; other dtypes take the plain lax collective (they carry no gradient)."""
    return jnp.issubdtype(x.dtype, jnp.inexact)


def encode_rows(codec: Codec, rows: jax.Array):
    """Encode each row of `rows` (P, m) separately: payloads (P, B) and one `ok` for all rows."""
    enc = jax.vmap(codec.encode)(rows)
    return enc.payload, enc.ok.all()


def encode_one(codec: Codec, row: jax.Array):
    enc = codec.encode(row)
    return enc.payload, enc.ok


def decode_rows(codec: Codec, payloads: jax.Array, m: int, dtype) -> jax.Array:
    return jax.vmap(lambda p: codec.decode(p, (m,), dtype))(payloads)


def to_rows(x: jax.Array, parts: int) -> tuple[jax.Array, int]:
    """Flatten `x` and split it into `parts` equal zero-padded rows: (rows (parts, m), m)."""
    per = -(-max(x.size, 1) // parts)
    flat = jnp.pad(x.reshape(-1), (0, parts * per - x.size))
    return pad_rows(flat.reshape(parts, per))


def pad_rows(rows: jax.Array) -> tuple[jax.Array, int]:
    """Zero-pad the rows of a (P, k) array to a multiple of `volume.ROW_MULTIPLE`: (rows, m)."""
    m = -(-rows.shape[1] // volume.ROW_MULTIPLE) * volume.ROW_MULTIPLE
    return jnp.pad(rows, ((0, 0), (0, m - rows.shape[1]))), m


def guarded(ok, axis_name, codec: Codec, compressed, raw):
    """Run `compressed()` if every rank's `ok` holds, else `raw()` on every rank (agreed first)."""
    if not codec.may_fail:
        return compressed()
    agreed = transport().all_agree(ok, axis_name)
    return lax.cond(agreed, compressed, raw)


def prepare(x, axis_name):
    """Mark `x` varying over the collective's axes (as `jax.lax` does) and say whether vma is on."""
    vma = check_vma_enabled()
    if vma:
        x = make_varying(x, axis_tuple(axis_name))
    return x, vma


def record(axis_name, kind, raw: float, wire: float, fallback: bool = False, anchor=None):
    """Tally one execution (see `jaxhc.accounting.record`) and return `anchor` unchanged."""
    accounting.record(axis_name, kind, raw, wire, fallback, anchor)
    return anchor


def nbytes(x) -> int:
    return int(math.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
