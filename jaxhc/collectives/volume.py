"""What a collective moves per device: the one byte model the collectives' ledger, the planner's
traffic and cost models and the link profiler share.

`ring` is a plain (uncompressed) collective as a ring moves it; `compressed` is what jaxhc's
algorithms move under a codec (its static payload per row or block, rows padded to
`ROW_MULTIPLE`, and the fallback agreement flags of a codec that may fail, `agreement`).

>>> import jax.numpy as jnp
>>> from jaxhc.codecs import Zfp
>>> from jaxhc.collectives import volume
>>> volume.ring("psum", 4, 1024)
(6, 1536.0)
>>> volume.compressed(Zfp(rate=8), "psum", 4, 256, jnp.float32)  # 3 x 64 B twice + 2 flag rounds
408
"""

from __future__ import annotations

from jaxhc.codecs import Codec

__all__ = ["OPS", "ROW_MULTIPLE", "agreement", "compressed", "ring", "rows"]

# Compressed chunks are padded to a multiple of ZFP's 1-D block so no chunk has a partial one (in
# 2-D/3-D this is the row of its layout: the codec pads a partial 16- or 64-value block itself).
ROW_MULTIPLE = 4
# The collectives `ring` models: a psum is a reduce-scatter and an all-gather.
OPS = ("all_gather", "psum_scatter", "all_to_all", "psum")


def ring(op: str, ranks: int, nbytes: float) -> tuple[int, float]:
    """(latency steps, bytes per device) of a plain `op` (one of `OPS`) over `ranks` ranks whose
    larger buffer (an all-gather's output, the others' input) holds `nbytes` bytes."""
    if op not in OPS:
        raise ValueError(f"ring: op {op!r} is not one of {', '.join(OPS)}")
    k = ranks
    if op == "psum":
        return 2 * (k - 1), 2 * (k - 1) / k * nbytes
    return k - 1, (k - 1) / k * nbytes


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
