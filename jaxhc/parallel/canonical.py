"""The checkpoint layout of a train state: global arrays that no mesh shape enters.

A mesh holds its train state in mesh-dependent shapes (`jaxhc.parallel.state`): the optimizer's
moments and master copy as one padded flat vector per (pipe, tensor) rank, split over the
optimizer-state group of the sharding plan (`jaxhc.parallel.amsp`; ZeRO: all of "data") and
replicated over the groups (the first replica writes), and error-feedback residuals as one padded
flat vector per device. No plan enters the canonical form: a state saved under one plan resumes
under any other. The canonical form
names one array per quantity and parameter, in the parameter's global (single-layout) shape:

* ``params/<path>``: the parameter, as `jaxhc.model.gpt` lays it out;
* ``opt/<opt path>/<path>`` for every flat optimizer vector (AdamW's ``mu`` and ``nu``, the
  ``master`` copy): the vector's elements put back where their parameter's elements are;
* ``residual/<path>``: shape (data, *parameter shape): data rank d's residual (the padding of the
  flat vectors is not stored: it is always zero, `jaxhc.parallel.zero` setting back to zero what a
  block-mixing codec such as q4:h decodes there);
* scalars (``step``, AdamW's ``count``): one value each.

`Canonical.pieces(coords)` lists, for the device at `coords`, which box of which canonical array
each part of its block holds; the same list converts both ways (`extract` for a save, `insert`
for a restore), so a state written on one mesh is read on any other. A box is a C-contiguous run
of the device's local block: a flat range is a few runs per parameter and layer
(`jaxhc.parallel.layout.FlatLayout.runs`), each at most 2 x ndim boxes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from jaxhc import partition
from jaxhc.model.config import AXES
from jaxhc.parallel.state import Plan, TrainState
from jaxhc.parallel.zero import levels as zero_levels
from jaxhc.parallel.zero import residual_sizes

CHUNK_ELEMENTS = 1 << 20  # the largest storage chunk, in elements (4 MiB of float32)


@dataclasses.dataclass(frozen=True)
class Piece:
    """One box of a canonical array held by a device.

    leaf:   index of the block's leaf (in `jax.tree.leaves` order of the TrainState) holding it;
    start:  offset of the box in that leaf's flattened values (the box is contiguous there);
    box:    the box in the canonical array;
    owner:  whether this device writes it (one device per box: coordinate 0 on replicated axes).
    """

    name: str
    leaf: int
    start: int
    box: tuple[slice, ...]
    owner: bool

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.box)


@dataclasses.dataclass(frozen=True)
class Array:
    """A canonical array: its shape, dtype and storage chunks (which split no device's block)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]


def flat_boxes(shape, lo: int, hi: int):
    """The elements [lo, hi) of a C-ordered array of `shape` as boxes (tuples of slices)."""
    if lo >= hi:
        return []
    if not shape:
        return [()]
    inner = math.prod(shape[1:])
    first, last = lo // inner, (hi - 1) // inner
    if first == last:
        rest = flat_boxes(shape[1:], lo - first * inner, hi - first * inner)
        return [(slice(first, first + 1), *b) for b in rest]
    out = []
    if lo % inner:
        out += flat_boxes(shape, lo, (first + 1) * inner)
        first += 1
    full = hi // inner
    if full > first:
        out.append((slice(first, full), *(slice(0, n) for n in shape[1:])))
    if hi % inner:
        out += flat_boxes(shape, full * inner, hi)
    return out


def storage_chunks(block_shape, limit: int = CHUNK_ELEMENTS) -> tuple[int, ...]:
    """Chunks that tile `block_shape` exactly (divisors), innermost dimensions whole first, at most
    `limit` elements: no chunk spans two devices' blocks, and none is large."""
    chunks = [1] * len(block_shape)
    size = 1
    for i in reversed(range(len(block_shape))):
        n = block_shape[i]
        c = max(d for d in _divisors(n) if size * d <= limit) if size <= limit else 1
        chunks[i] = c
        size *= c
        if c < n:
            break
    return tuple(chunks)


def _divisors(n: int):
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in small]


class Canonical:
    """The canonical arrays of a train state on the mesh of `plan`, and each device's pieces."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.mesh_shape = dict(zip(AXES, plan.mesh_cfg.shape, strict=True))
        # The data levels whose reduce-scatters keep error-feedback residuals, innermost first.
        self.residual_levels = [n for _, n in zero_levels(plan.shard)]
        self.layout = layout = plan.layout
        param_paths = jax.tree.flatten_with_path(plan.param_shapes)[0]
        self.param_names = ["/".join(_names(p)) for p, _ in param_paths]
        self.param_global = [x.shape for _, x in param_paths]
        self.param_specs = layout.treedef.flatten_up_to(plan.param_specs)
        self.arrays: dict[str, Array] = {"step": Array((), np.dtype(np.int32), ())}
        # Per leaf of a device's block (`jax.tree.leaves` order of a TrainState): its kind
        # ("scalar", "param", "flat" or "residual") and its canonical name (or name prefix).
        self.kinds = [("scalar", "step")]
        # A flat vector's pieces are runs of a device's ZeRO chunk: chunks well under its size
        # leave only the two at its ends shared with a neighbour.
        flat_limit = min(CHUNK_ELEMENTS, max(layout.chunk // 8, 4096))
        if plan.sharded_params:  # one flat chunk per device (s_p > 1)
            self.kinds.append(("pflat", "params"))
        for name, shape, spec in zip(
            self.param_names, self.param_global, self.param_specs, strict=True
        ):
            if not plan.sharded_params:
                self.kinds.append(("param", f"params/{name}"))
            limit = flat_limit if plan.sharded_params else CHUNK_ELEMENTS
            self._add(f"params/{name}", shape, spec, limit=limit)
        for path, x in jax.tree.flatten_with_path(plan.opt_local)[0]:
            name = "/".join(_names(path))
            if x.ndim == 0:
                self.kinds.append(("scalar", f"opt/{name}"))
                self.arrays[f"opt/{name}"] = Array((), np.dtype(x.dtype), ())
                continue
            kind = "residual" if name == "residual" else "flat"
            name = "residual" if kind == "residual" else f"opt/{name}"
            self.kinds.append((kind, name))
            lead = (plan.mesh_cfg.data,) if kind == "residual" else ()
            names = residual_names(plan) if kind == "residual" else [name]
            for n in names:
                for p, shape, spec in zip(
                    self.param_names, self.param_global, self.param_specs, strict=True
                ):
                    self._add(f"{n}/{p}", shape, spec, lead, limit=flat_limit)

    def _block_shape(self, shape, spec):
        return tuple(
            s.stop - s.start
            for s in partition.block_slices(spec, shape, dict.fromkeys(AXES, 0), self.mesh_shape)
        )

    def _add(self, name, shape, spec, lead=(), limit=CHUNK_ELEMENTS):
        chunks = (1,) * len(lead) + storage_chunks(self._block_shape(shape, spec), limit)
        self.arrays[name] = Array((*lead, *shape), np.dtype(np.float32), chunks)

    def pieces(self, coords) -> list[Piece]:
        """Every box of every canonical array that the device at `coords` holds."""
        zero = all(v == 0 for v in coords.values())
        shard, out = self.plan.shard, []
        d = coords["data"]
        for leaf, (kind, name) in enumerate(self.kinds):
            if kind == "scalar":
                out.append(Piece(name, leaf, 0, (), zero))
            elif kind == "param":
                i = leaf - 1  # the parameters follow the step
                box = partition.block_slices(
                    self.param_specs[i], self.param_global[i], coords, self.mesh_shape
                )
                owner = partition.owns_block(self.param_specs[i], len(box), coords, self.mesh_shape)
                out.append(Piece(name, leaf, 0, box, owner))
            elif kind == "pflat":
                index, first = shard.param_chunk(d)
                size = self.layout.padded // shard.params
                out += self._flat(leaf, name, coords, index * size, size, 0, first)
            elif kind == "flat":
                index, first = shard.optim_chunk(d)
                size = self.layout.padded // shard.optim
                out += self._flat(leaf, name, coords, index * size, size, 0, first)
            else:  # residuals: each level's chunk of the padded vector, one level after another
                at, done = 0, ()  # the levels scattered before: innermost last
                names, levels = residual_names(self.plan), zero_levels(shard)
                for level, size in enumerate(residual_sizes(self.layout.padded, shard)):
                    lo = shard.chunk_of(d, done)[0] * size
                    out += self._flat(leaf, names[level], coords, lo, size, at, True, row=d)
                    at += size
                    done = (levels[level][0], *done)
        return out

    def _flat(self, leaf, name, coords, lo, size, at, first, row=None) -> list[Piece]:
        """The pieces of elements [lo, lo + size) of a device's padded flat vector, which sit at
        `at` in its leaf; `row`: the leading index of a per-data-rank array (residuals)."""
        layout, out = self.layout, []
        # The data ranks' copies are told apart by `first` (which rank's chunk it is); among the
        # other axes, the canonical copy is the parameter's own rule (`partition.owns_block`).
        canon = {**coords, "data": 0}
        owns = [
            partition.owns_block(spec, len(shape), canon, self.mesh_shape)
            for spec, shape in zip(self.param_specs, self.param_global, strict=True)
        ]
        blocks = [
            partition.block_slices(spec, shape, coords, self.mesh_shape)
            for spec, shape in zip(self.param_specs, self.param_global, strict=True)
        ]
        for offset, i, a, n in layout.runs(lo, lo + size):
            p, block = self.param_names[i], blocks[i]
            for local in flat_boxes(layout.shapes[i], a, a + n):
                box = tuple(
                    slice(g.start + s.start, g.start + s.stop)
                    for g, s in zip(block, local, strict=True)
                )
                if row is not None:
                    box = (slice(row, row + 1), *box)
                owner = first and owns[i]
                out.append(Piece(f"{name}/{p}", leaf, int(at + offset - lo), box, owner))
                offset += math.prod(s.stop - s.start for s in local)
        return out

    def zero_block(self) -> list[np.ndarray]:
        """Zeros shaped like a device's block leaves (in `jax.tree.leaves` order)."""
        return [np.zeros(x.shape, x.dtype) for x in jax.tree.leaves(self.global_shapes(local=True))]

    def global_shapes(self, local: bool = False) -> TrainState:
        """The TrainState's global shapes on this mesh (`local`: a device's block shapes)."""
        plan, m = self.plan, self.plan.mesh_cfg

        def opt(x):  # `Plan.zero_opt_state`'s shapes, without the zeros
            shape = (m.pipe, m.tensor, m.data * x.shape[0]) if x.ndim else ()
            return jax.ShapeDtypeStruct(shape, x.dtype)

        step = jax.ShapeDtypeStruct((), np.int32)
        params = plan.param_shapes
        if plan.sharded_params:
            params = opt(jax.ShapeDtypeStruct((plan.param_chunk,), np.float32))
        state = TrainState(step, params, jax.tree.map(opt, plan.opt_local))

        def shape(spec, x):
            s = self._block_shape(x.shape, spec) if local else x.shape
            return jax.ShapeDtypeStruct(s, x.dtype)

        return partition.map_specs(shape, plan.state_specs, state)

    def unflatten(self, leaves) -> TrainState:
        """A TrainState from a device's block leaves (in `jax.tree.leaves` order)."""
        plan = self.plan
        params = plan.param_shapes
        if plan.sharded_params:
            params = jax.ShapeDtypeStruct((plan.param_chunk,), np.float32)
        state = TrainState(jax.ShapeDtypeStruct((), np.int32), params, plan.opt_local)
        return jax.tree.unflatten(jax.tree.structure(state), leaves)


def residual_names(plan: Plan) -> list[str]:
    """The canonical name of each level's error-feedback residuals (`zero.levels` order):
    ``residual`` for the first (the one level of a flat data axis), ``residual.<j>`` after."""
    n = len(zero_levels(plan.shard))
    return ["residual"] + [f"residual.{j}" for j in range(1, n)]


def extract(piece: Piece, leaf: np.ndarray) -> np.ndarray:
    """The values of `piece` from its leaf of a device's block."""
    flat = np.asarray(leaf).reshape(-1)
    return flat[piece.start : piece.start + math.prod(piece.shape)].reshape(piece.shape)


def insert(piece: Piece, leaf: np.ndarray, values) -> None:
    """Write `values` (the piece's box) into its leaf of a device's block (in place)."""
    flat = leaf.reshape(-1)
    flat[piece.start : piece.start + math.prod(piece.shape)] = np.asarray(values).reshape(-1)


def _names(path) -> list[str]:
    """A key path as names: dict keys, attribute names, sequence indices."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
    return out
