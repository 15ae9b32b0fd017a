"""The fused MPI collectives (ffi/mpi): psum, psum_scatter and all_gather in one native call each.

Inside the call, segments of the message are encoded, moved by non-blocking MPI and decoded with
the three overlapping, as MVAPICH puts compression inside MPI; results are bitwise those of jaxhc's
algorithms on the XLA transport (ffi/mpi/engine.h says why). XLA:CPU cannot overlap a codec call
with an mpi4jax call that blocks (measured), which is why this lives in native code.

The primitives join mpi4jax's ordered effect, so they run in program order with every other MPI
call of the program on every rank, as mpi4jax's own do. Each returns the values and the traffic
this rank sent (for `jaxhc.accounting`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from jaxhc import _native
from jaxhc.codecs import Codec, NativeCall

DTYPES = frozenset(jnp.dtype(d) for d in (jnp.float32, jnp.float64, jnp.bfloat16))
# The engine's codec numbers (ffi/mpi/module.cc) by `NativeCall.family`.
_FAMILY = {"plain": 0, "zfp": 1, "mpc": 2, "quant": 3, "quant:h": 4}
_PLAIN = NativeCall("plain", 0, 1, 0.0)
SEGMENT_BYTES = 1 << 20  # raw bytes per pipelined segment of a compressed call
# A plain call has only its sums to overlap. Either kind of segment travels as MPI messages under
# Open MPI's TCP eager limit (ffi/mpi/engine.cc, kPieceBytes: larger ones ran half duplex).
PLAIN_SEGMENT_BYTES = 1 << 18


def available() -> bool:
    return _native.mpi is not None


def supports(codec: Codec | None, dtype) -> bool:
    """Whether a fused call exists for this codec (None: plain) and dtype."""
    return available() and fusable(codec, dtype)


def fusable(codec: Codec | None, dtype) -> bool:
    """Whether the engine has a fused call for this codec (None: plain) and dtype, built or not."""
    return jnp.dtype(dtype) in DTYPES and (codec is None or codec.native_call(dtype) is not None)


def _primitive(name, abstract, attrs):
    """An MPI primitive of mpi4jax's ordered effect lowered to the FFI target `name`:
    ``abstract(x, **params)`` gives its output avals, ``attrs(**params)`` the target's
    attributes."""
    from jax.extend.core import Primitive
    from mpi4jax._src.jax_compat import abstract_token, get_token_effect, set_token_effect
    from mpi4jax._src.utils import ordered_effect

    prim = Primitive(name)
    prim.multiple_results = True

    def lowering(ctx, *args, **params):
        token = get_token_effect(ctx, ordered_effect)
        ctx_t = ctx.replace(
            avals_in=(*ctx.avals_in, abstract_token), avals_out=(*ctx.avals_out, abstract_token)
        )
        rule = jax.ffi.ffi_lowering(name, has_side_effect=True)
        *results, token = rule(ctx_t, *args, token, **attrs(**params))
        set_token_effect(ctx, ordered_effect, token)
        return results

    prim.def_effectful_abstract_eval(lambda *a, **p: (abstract(*a, **p), {ordered_effect}))
    prim.def_impl(functools.partial(jax._src.dispatch.apply_primitive, prim))
    mlir.register_lowering(prim, lowering, platform="cpu")
    return prim


def _codec_attrs(comm, codec, maxbits, dim, budget, bits, block, segment_bytes, **_):
    return {
        "comm": np.int64(comm),
        "codec": np.int64(codec),
        "maxbits": np.int64(maxbits),
        "dim": np.int64(dim),
        "budget": np.float64(budget),
        "bits": np.int64(bits),
        "block": np.int64(block),
        "segment_bytes": np.int64(segment_bytes),
    }


_OUT_SIZE = (lambda n, p: n, lambda n, p: n // p, lambda n, p: n * p)  # psum, scatter, gather
_STATS = jax.core.ShapedArray((3,), jnp.int32)
_HANDLE = jax.core.ShapedArray((1,), jnp.float32)


@functools.cache
def _primitives():
    """(psum, psum_scatter, all_gather, start, done) primitives, built on first use (mpi4jax
    imported then)."""

    def sync(name, which):
        def abstract(x, *, parts, **_):
            return jax.core.ShapedArray((_OUT_SIZE[which](x.shape[0], parts),), x.dtype), _STATS

        return _primitive(name, abstract, _codec_attrs)

    start = _primitive(
        "jaxhc_mpi_start",
        lambda x, **_: (_HANDLE,),
        lambda op, **p: {**_codec_attrs(**p), "op": np.int64(op)},
    )
    done = _primitive(
        "jaxhc_mpi_done",
        lambda h, *, size, dtype: (jax.core.ShapedArray((size,), dtype), _STATS),
        lambda **_: {},
    )
    return (
        sync("jaxhc_mpi_psum", 0),
        sync("jaxhc_mpi_psum_scatter", 1),
        sync("jaxhc_mpi_all_gather", 2),
        start,
        done,
    )


@functools.cache
def _feedback_primitive():
    """The psum_scatter with error feedback (``jaxhc_mpi_psum_scatter_ef``), built on first use."""

    def abstract(x, residual, *, parts, **_):
        mine = jax.core.ShapedArray((x.shape[0] // parts,), x.dtype)
        return mine, jax.core.ShapedArray(residual.shape, jnp.float32), _STATS

    return _primitive("jaxhc_mpi_psum_scatter_ef", abstract, _codec_attrs)


def _params(flat, comm, codec: Codec | None) -> dict:
    from mpi4jax._src.utils import to_mpi_handle

    call = _PLAIN if codec is None else codec.native_call(flat.dtype)
    return {
        "comm": int(to_mpi_handle(comm)),
        "parts": comm.Get_size(),
        "codec": _FAMILY[call.family],
        "maxbits": call.maxbits,
        "dim": call.dim,
        "budget": float(call.budget),
        "bits": call.bits,
        "block": call.block,
        "segment_bytes": SEGMENT_BYTES if codec is not None else PLAIN_SEGMENT_BYTES,
    }


def _traffic(y, stats):
    wire = stats[0].astype(jnp.float32) + stats[1].astype(jnp.float32) * 2.0**31
    return y, wire, stats[2] > 0


def _bind(which: int, flat, comm, codec: Codec | None):
    return _traffic(*_primitives()[which].bind(flat, **_params(flat, comm, codec)))


def psum(flat, comm, codec: Codec | None):
    """(the reduced values, wire bytes sent, fell back) of a psum of the 1-D `flat`."""
    return _bind(0, flat, comm, codec)


def psum_scatter(rows_flat, comm, codec: Codec | None):
    """This rank's reduced row of P equal rows laid end to end in the 1-D `rows_flat`."""
    return _bind(1, rows_flat, comm, codec)


def feedback_supported(codec: Codec | None, dtype) -> bool:
    """Whether `psum_scatter_feedback` takes this codec and dtype (`feedback_fusable`, a build
    that has the call)."""
    return feedback_fusable(codec, dtype) and available() and _has_feedback()


def feedback_fusable(codec: Codec | None, dtype) -> bool:
    """Whether the engine has `psum_scatter_feedback` for this codec and dtype, built or not:
    float32 under a codec the engine fuses."""
    return codec is not None and jnp.dtype(dtype) == jnp.float32 and fusable(codec, dtype)


@functools.cache
def _has_feedback() -> bool:
    return "jaxhc_mpi_psum_scatter_ef" in _native.mpi.registrations()


def psum_scatter_feedback(rows_flat, residual_flat, comm, codec: Codec):
    """`psum_scatter` with error feedback, in one native pass: (this rank's reduced row, the new
    residual (as `rows_flat`), wire bytes sent, fell back). Each rank sends ``rows_flat +
    residual_flat`` and keeps what the codec lost of it, computed segment by segment as the
    segments are encoded (ffi/mpi/engine.h, Options): the unfused algorithm's values and
    residuals, bit for bit."""
    y, new, stats = _feedback_primitive().bind(
        rows_flat, residual_flat, **_params(rows_flat, comm, codec)
    )
    y, wire, fell = _traffic(y, stats)
    return y, new, wire, fell


def all_gather(flat, comm, codec: Codec | None):
    """Every rank's 1-D `flat`, laid end to end in rank order."""
    return _bind(2, flat, comm, codec)


def async_ready() -> bool:
    """Whether `start` hands calls to the engine's progress threads (MPI initialised with
    MPI_THREAD_MULTIPLE, and JAXHC_MPI_ASYNC is not "0"); otherwise a started call runs in its
    start and nothing overlaps."""
    return available() and _native.mpi.async_ready()


def outstanding() -> int:
    """How many started calls of this process no done has taken yet (0 between steps)."""
    return _native.mpi.outstanding() if available() else 0


OPS = {"psum": 0, "psum_scatter": 1, "all_gather": 2, "psum_scatter_ef": 3}


def start(op: str, flat, comm, codec: Codec | None) -> jax.Array:
    """Start `op` ("psum", "psum_scatter" or "all_gather", as the functions above, or
    "psum_scatter_ef": `psum_scatter_feedback` of the values and the residual laid end to end,
    its done giving the reduced row and the new residual end to end) of the 1-D `flat` on
    `comm`, which nothing else may use until it is done (the MPI transport's async
    communicators): the handle (float32 [1]) that `done` takes. The call runs on `comm`'s
    progress thread, in the order of its starts, while the program goes on."""
    params = _params(flat, comm, codec)
    params.pop("parts")
    return _primitives()[3].bind(flat, op=OPS[op], **params)[0]


def done(handle, size: int, dtype):
    """(the values, wire bytes sent, fell back) of the started call `handle` (`size` values of
    `dtype`, as the synchronous call gives them), once it has finished."""
    return _traffic(*_primitives()[4].bind(handle, size=int(size), dtype=jnp.dtype(dtype)))
