"""A pytree reduced as a few buckets: one message (and one agreement vote) per bucket, not per leaf.

The array leaves are grouped by dtype (and weak type, and the mesh axes they vary over under
shard_map's ``check_vma``), in tree order; each group is cut into buckets of at most
`bucket_bytes` raw bytes (a leaf larger than that is a bucket of its own). A bucket's leaves are
flattened and concatenated into one 1-D array, the one-array collective runs on it, and its
result is split back into the leaves' shapes. Concatenating and splitting are ordinary jax ops,
so reverse and forward differentiation go through the one-array collective as for a single leaf.

Under a lossy block codec (zfp's 4-, 16- or 64-value blocks, a quantizer's `block`) every leaf
starts on a block boundary of every rank's chunk: each leaf is zero-padded to a whole number of
blocks and the bucket to a whole number of blocks per rank, so no block mixes two leaves and a
small leaf keeps its own exponent or scale next to a large one (the error bound of each leaf is
the one it has when sent alone). Lossless codecs and plain sums need no padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxhc._compat import varying_axes
from jaxhc.codecs import Codec
from jaxhc.collectives import _common as c
from jaxhc.transport import current as transport

__all__ = ["DEFAULT_BUCKET_BYTES", "Bucket", "block_values", "check", "plan", "reduce_tree"]

# The order of PyTorch DDP's default bucket (bucket_cap_mb=25).
DEFAULT_BUCKET_BYTES = 32 * 2**20


@dataclasses.dataclass
class Bucket:
    """Leaf indices (in tree order) of one message, and their raw bytes."""

    leaves: list[int]
    nbytes: int = 0


def _key(a) -> tuple:
    aval = jax.typeof(a)
    return (jnp.dtype(a.dtype), bool(getattr(aval, "weak_type", False)), varying_axes(a))


def plan(arrays: dict[int, jax.Array], bucket_bytes: int) -> list[Bucket]:
    """The buckets of `arrays` (leaf index -> prepared array), ordered by their first leaf.

    Leaves of one key (dtype, weak type, varying axes) fill a bucket in tree order until the
    next one would take it over `bucket_bytes`; a leaf of `bucket_bytes` or more is sent alone.
    """
    done, open_ = [], {}
    for i, a in arrays.items():
        size, key = c.nbytes(a), _key(a)
        if size >= bucket_bytes:
            done.append(Bucket([i], size))
            continue
        b = open_.get(key)
        if b is not None and b.nbytes + size > bucket_bytes:
            done.append(open_.pop(key))
            b = None
        if b is None:
            b = open_[key] = Bucket([])
        b.leaves.append(i)
        b.nbytes += size
    return sorted(done + list(open_.values()), key=lambda b: b.leaves[0])


def check(bucket_bytes) -> None:
    """One-line error unless `bucket_bytes` is None or a non-negative int."""
    ok = bucket_bytes is None or (
        isinstance(bucket_bytes, int) and not isinstance(bucket_bytes, bool) and bucket_bytes >= 0
    )
    if not ok:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be a non-negative integer or None")


def block_values(codec: Codec | None) -> int:
    """Values per independently coded block of a lossy block codec (1: no alignment needed)."""
    return 1 if codec is None else codec.block_values


def reduce_tree(
    x,
    axis_name,
    bucket_bytes: int | None,
    single: Callable,
    resolve: Callable,
    bucket: Callable,
    rows: int | None = None,
):
    """Reduce the pytree `x` over `axis_name` bucket by bucket.

    `single(leaf)`: the one-leaf collective (Python numbers, leaves alone in their bucket, every
    leaf when `bucket_bytes` is None or 0). `resolve(stand_in)`: the codec for a bucket, given a
    ShapeDtypeStruct of its unpadded size (so a policy's ``min_bytes`` applies to the message).
    `bucket(flat, codec, nbytes)`: the collective of the 1-D concatenation `flat` (leaves already
    marked varying over `axis_name`), `nbytes` the leaves' raw bytes without padding. `rows`: the
    chunks a lossy block codec encodes each bucket in (default: one per rank of the axis; 1 for a
    collective that sends whole arrays).
    """
    check(bucket_bytes)
    leaves, tree = jax.tree.flatten(x)
    if not bucket_bytes or len(leaves) < 2:
        return tree.unflatten([single(a) for a in leaves])
    out: list = [None] * len(leaves)
    arrays = {}
    for i, a in enumerate(leaves):
        if c.python_number(a):
            out[i] = single(a)
        else:
            arrays[i] = c.prepare(c.as_array(a), axis_name)[0]
    rows = transport().axis_size(axis_name) if rows is None else rows
    for b in plan(arrays, bucket_bytes):
        if len(b.leaves) == 1:
            out[b.leaves[0]] = single(arrays[b.leaves[0]])
            continue
        parts = [arrays[i] for i in b.leaves]
        total = sum(p.size for p in parts)
        codec = resolve(jax.ShapeDtypeStruct((total,), parts[0].dtype))
        flat, offsets = _concat(parts, block_values(codec), rows)
        y = bucket(flat, codec, b.nbytes)
        for i, p, start in zip(b.leaves, parts, offsets, strict=True):
            out[i] = lax.slice(y, (start,), (start + p.size,)).reshape(p.shape)
    return tree.unflatten(out)


def _concat(parts, block: int, ranks: int):
    """(1-D concatenation of `parts`, each leaf's offset in it); with block > 1, each leaf padded
    to whole blocks and the total to whole blocks per rank."""
    pieces, offsets, at = [], [], 0
    for p in parts:
        offsets.append(at)
        pieces.append(p.reshape(-1))
        at += p.size
        if block > 1 and at % block:
            pieces.append(_zeros(p, block - at % block))
            at += block - at % block
    if block > 1 and at % (block * ranks):
        pieces.append(_zeros(parts[-1], block * ranks - at % (block * ranks)))
    return lax.concatenate(pieces, 0), offsets


def _zeros(like, n: int):
    """n zeros of `like`'s dtype, weak type and varying axes (so concatenate takes them)."""
    return lax.full_like(like, 0, shape=(n,))
