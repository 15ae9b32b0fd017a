"""Reading a sharded checkpoint back (`jaxhc.train.checkpoint`): its meta.json read and checked,
its arrays matched against a run's, the rule for error-feedback residuals written on another data
size, and each device's block read straight from the stored boxes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator

import numpy as np
import tensorstore as ts

from jaxhc.parallel.canonical import Canonical, insert
from jaxhc.train.checkpoint_files import FORMAT, META, Arrays, digest

__all__ = ["Corrupt", "check_matches", "is_residual", "read_blocks", "read_meta", "residual_rule"]

log = logging.getLogger("jaxhc.train.checkpoint")


class Corrupt(ValueError):
    """A checkpoint's meta.json that cannot be what was written."""


def read_meta(directory: str, step: int) -> dict:
    """The meta.json of checkpoint `step` in `directory`: a ValueError when there is none or it is
    of another format, `Corrupt` when its bytes are not those written."""
    path = os.path.join(directory, str(step), META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no checkpoint of step {step} in {directory}") from None
    except (OSError, ValueError) as e:
        raise Corrupt(f"checkpoint file {path} is corrupt: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{path}: format {got!r} is not {FORMAT!r}")
    if meta.get("digest") != digest(meta):
        raise Corrupt(f"checkpoint file {path} is corrupt: its bytes differ from when written")
    return meta


def check_matches(path: str, canon: Canonical, stored: dict) -> None:
    """A ValueError naming the first array of `canon` (residuals aside) that the checkpoint at
    `path`, whose meta.json lists `stored` arrays, lacks or holds in another shape or dtype."""
    for name, a in canon.arrays.items():
        if is_residual(name):
            continue
        want = _describe(a)
        if name not in stored:
            raise ValueError(f"checkpoint {path} does not match this run: it has no {name}")
        if stored[name] != want:
            got = stored[name]
            raise ValueError(
                f"checkpoint {path} does not match this run: {name} is "
                f"{np.dtype(got['dtype']).name}{list(got['shape'])} there, "
                f"{a.dtype.name}{list(a.shape)} here"
            )


def residual_rule(path, canon: Canonical, meta) -> int | None:
    """None: residuals map exactly (or there are none to restore); else the writer's data
    size, whose residuals are summed and spread."""
    wanted = any(is_residual(n) for n in canon.arrays)
    stored = any(is_residual(n) for n in meta["arrays"])
    if not wanted:
        if stored:
            log.warning("%s: error-feedback residuals not restored (this run keeps none)", path)
        return None
    if not stored:
        log.warning("%s: no error-feedback residuals there; they start at zero", path)
        return None
    old = meta["mesh"]["data"]
    levels = meta.get("residual_levels", [old])  # before nested levels: one, all of data
    if old == canon.mesh_shape["data"] and levels == canon.residual_levels:
        return None
    log.warning(
        "%s: written with data=%d (reduction levels %s), resumed with data=%d (levels %s): "
        "each element's error-feedback residuals are summed and spread evenly over the new "
        "data ranks",
        path,
        old,
        levels,
        canon.mesh_shape["data"],
        canon.residual_levels,
    )
    return old


def read_blocks(arrays: Arrays, canon: Canonical, meta, coords, spread) -> Iterator:
    """The blocks ``(coords, leaves)`` of the devices at `coords`, read from the checkpoint's
    `arrays` (`spread`: `residual_rule`'s answer)."""
    has_residual = any(is_residual(n) for n in meta["arrays"])
    stored_levels = sorted({n.split("/")[0] for n in meta["arrays"] if is_residual(n)})
    for c in coords:
        leaves = canon.zero_block()
        for piece in canon.pieces(c):
            if not piece.box:
                value = meta["scalars"][piece.name]
                leaves[piece.leaf][...] = value
                continue
            if is_residual(piece.name):
                if not has_residual:
                    continue
                if spread is not None:
                    # Every stored level's residuals of these elements (a rank's row holds
                    # its chunk of a level, zeros elsewhere) into the first level.
                    level, rest_name = piece.name.split("/", 1)
                    if level != "residual":
                        continue
                    rest = piece.box[1:]
                    total = 0.0
                    for stored_level in stored_levels:
                        store = arrays[f"{stored_level}/{rest_name}"]
                        total = total + sum(
                            store[(slice(d, d + 1), *rest)].read().result().astype(np.float64)
                            for d in range(spread)
                        )
                    insert(piece, leaves[piece.leaf], total / canon.mesh_shape["data"])
                    continue
            _read_into(piece, leaves[piece.leaf], arrays[piece.name][piece.box])
        yield c, leaves


def _read_into(piece, leaf: np.ndarray, source) -> None:
    """Read the stored box `source` straight into its place in `leaf` (what `insert` does with a
    read array, without the temporary copy: a restore then holds its blocks and tensorstore's
    chunk buffers, not a second copy of the largest piece)."""
    n = math.prod(source.shape)
    flat = leaf.reshape(-1)
    if n != math.prod(piece.shape) or not np.shares_memory(flat, leaf):
        insert(piece, leaf, source.read().result())  # not a view of the leaf: copy it in
        return
    view = flat[piece.start : piece.start + n].reshape(source.shape)
    ts.array(view, copy=False, write=True).write(source.translate_to[0]).result()


def is_residual(name: str) -> bool:
    """Whether canonical array `name` holds error-feedback residuals (of any reduction level)."""
    level = name.split("/")[0]
    return level == "residual" or level.startswith("residual.")


def _describe(a) -> dict:
    return {"shape": list(a.shape), "dtype": a.dtype.str}
