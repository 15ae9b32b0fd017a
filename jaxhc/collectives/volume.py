"""What a collective moves per device: the one byte model the collectives' ledger, the planner's
traffic and cost models and the link profiler share.

`raw` is what a plain (uncompressed) collective moves per device as a ring moves it, for the bytes
a rank passes in, and `steps` its latency steps (`ring`: both, for the bytes of its larger
buffer); `compressed` is what jaxhc's algorithms move under a codec (its static payload per row
or block, rows padded to `ROW_MULTIPLE`, and the fallback agreement flags of a codec that may
fail, `agreement`).

>>> import jax.numpy as jnp
>>> from jaxhc.codecs import Zfp
>>> from jaxhc.collectives import volume
>>> volume.raw("psum", 4, 1024), volume.raw("all_gather", 4, 256), volume.steps("psum", 4)
(1536.0, 768, 6)
>>> volume.ring("psum", 4, 1024)
(6, 1536.0)
>>> volume.compressed(Zfp(rate=8), "psum", 4, 256, jnp.float32)  # 3 x 64 B twice + 2 flag rounds
408
"""

from __future__ import annotations

from jaxhc.codecs import Codec

__all__ = [
    "OPS",
    "RAW_OPS",
    "ROW_MULTIPLE",
    "agreement",
    "compressed",
    "permute",
    "raw",
    "ring",
    "rows",
    "steps",
]

# Compressed chunks are padded to a multiple of ZFP's 1-D block so no chunk has a partial one (in
# 2-D/3-D this is the row of its layout: the codec pads a partial 16- or 64-value block itself).
ROW_MULTIPLE = 4
# The collectives `ring` models: a psum is a reduce-scatter and an all-gather.
OPS = ("all_gather", "psum_scatter", "all_to_all", "psum")
# The collectives `raw` and `steps` model: `OPS`, a pipeline's shift (ppermute: every rank but
# the last sends), the exchange of two ranks (psum_pair) and a pipelined ring broadcast.
RAW_OPS = (*OPS, "ppermute", "psum_pair", "broadcast")


def raw(op: str, ranks: int, nbytes: float) -> float:
    """Bytes per device a plain `op` (one of `RAW_OPS`) moves over `ranks` ranks when each rank
    passes in `nbytes` bytes (the ledger's ``raw_bytes``): an all-gather every other rank's block,
    a reduce-scatter or all-to-all (k - 1) / k of its input, a psum both."""
    k = ranks
    if op == "all_gather":
        return (k - 1) * nbytes
    if op in ("psum_scatter", "all_to_all"):
        return (k - 1) / k * nbytes
    if op == "psum":
        return 2 * (k - 1) / k * nbytes
    if op == "ppermute":
        return permute(k - 1, k, nbytes)
    if op == "psum_pair":
        return permute(2, k, nbytes)
    if op == "broadcast":
        return nbytes  # a pipelined ring: every link carries the whole message
    raise ValueError(f"raw: op {op!r} is not one of {', '.join(RAW_OPS)}")


def permute(senders: int, ranks: int, nbytes: float) -> float:
    """Bytes per device of a permutation in which `senders` of `ranks` ranks send `nbytes`."""
    return senders / ranks * nbytes


def steps(op: str, ranks: int) -> int:
    """Latency steps of `op` (one of `RAW_OPS`) over `ranks` ranks as a ring runs it."""
    if op not in RAW_OPS:
        raise ValueError(f"steps: op {op!r} is not one of {', '.join(RAW_OPS)}")
    return {"psum": 2 * (ranks - 1), "ppermute": 1, "psum_pair": 1}.get(op, ranks - 1)


def ring(op: str, ranks: int, nbytes: float) -> tuple[int, float]:
    """(latency steps, bytes per device) of a plain `op` (one of `OPS`) over `ranks` ranks whose
    larger buffer (an all-gather's output, the others' input) holds `nbytes` bytes."""
    if op not in OPS:
        raise ValueError(f"ring: op {op!r} is not one of {', '.join(OPS)}")
    # an all-gather moves what the reduce-scatter of its output (its reverse) moves
    return steps(op, ranks), raw("psum_scatter" if op == "all_gather" else op, ranks, nbytes)


def agreement(codec: Codec, ranks: int) -> int:
    """Bytes of the all-ranks flag agreement (an int32 per rank) when the codec may fail."""
    return 4 * (ranks - 1) if codec.may_fail else 0


def rows(message: int, ranks: int) -> int:
    """Values per row when a message of `message` values is cut into one row per rank."""
    return -(-message // ranks // ROW_MULTIPLE) * ROW_MULTIPLE


def compressed(codec: Codec, op: str, ranks: int, message: int, dtype) -> float:
    """Bytes per device that jaxhc's algorithm for `op` moves under `codec` for a message of
    `message` values of `dtype` a rank passes in (a psum: reduce-scatter then all-gather; an
    all-gather: every other rank's payload; a ppermute: its payload)."""
    agree = agreement(codec, ranks)
    if op in ("all_gather", "ppermute", "psum_pair"):
        mult = {"all_gather": ranks - 1, "ppermute": (ranks - 1) / ranks}.get(op, 2 / ranks)
        return mult * codec.payload_bytes(message, dtype) + agree
    per = (ranks - 1) * codec.payload_bytes(rows(message, ranks), dtype) + agree
    return 2 * per if op == "psum" else per
