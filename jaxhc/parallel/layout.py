"""Where each parameter lives on the ("data", "tensor", "pipe") mesh, and the flat ZeRO vector.

Every mesh holds the same global parameter arrays (the single layout of `jaxhc.model.gpt`):

* ``blocks/*``: the leading layer axis is split over "pipe" into contiguous stages; Megatron splits
  over "tensor" the heads of ``attn/c_attn`` and ``attn/c_proj.kernel`` and the hidden units of
  ``mlp/c_fc`` and ``mlp/c_proj.kernel`` (LLaMA: the query and key/value heads of
  ``attn/{q,k,v,o}_proj`` and the units of ``mlp/{gate,up,down}_proj``). Norms and the
  row-parallel biases are replicated over "tensor".
* ``wte``, ``wpe``, ``ln_f`` (`SHARED`; LLaMA: ``wte``, ``ln_f`` and an untied ``lm_head``):
  replicated over "tensor" and "pipe", but each is read by some stages only: the first embeds
  (``wte``, ``wpe``), the last applies ``ln_f`` and the head (tied to ``wte``, or ``lm_head``).
  The first stage holds the canonical copy of each (the one the gradient norm counts, a
  checkpoint writes and `jaxhc.parallel.params_to_single` returns): those the last stage reads
  (`PAIRED`: ``ln_f``, the head, and ``wte`` when tied) have their gradients summed over the pair
  of end stages, so both ends update the same bits; the first stage's alone (``wpe``, an untied
  ``wte``) need no sum (but join the pair under a lossy data codec: see
  `jaxhc.parallel.grads.paired`). The middle stages' copies (and the last stage's first-stage-only
  ones) get zero gradients: stale copies that no stage reads and no reader takes.
* Parameters are replicated over "data" (ZeRO-1); AdamW's moments are split over "data".

ZeRO works on each rank's local parameters flattened into one vector (`FlatLayout`), padded so that
it splits into equal chunks over "data", each of which holds a slice of every layer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxhc.model.config import MeshConfig

# Per-layer dimension of each block parameter that Megatron splits over "tensor".
TENSOR_SPLIT = {
    ("attn", "c_attn", "kernel"): 2,  # (C, 3, H, D): heads
    ("attn", "c_attn", "bias"): 1,  # (3, H, D)
    ("attn", "c_proj", "kernel"): 0,  # (H, D, C)
    ("mlp", "c_fc", "kernel"): 1,  # (C, 4C): hidden units
    ("mlp", "c_fc", "bias"): 0,  # (4C,)
    ("mlp", "c_proj", "kernel"): 0,  # (4C, C)
    # LLaMA: query and key/value heads, SwiGLU's units.
    ("attn", "q_proj", "kernel"): 1,  # (C, H, D)
    ("attn", "k_proj", "kernel"): 1,  # (C, KV, D)
    ("attn", "v_proj", "kernel"): 1,  # (C, KV, D)
    ("attn", "o_proj", "kernel"): 0,  # (H, D, C)
    ("mlp", "gate_proj", "kernel"): 1,  # (C, I)
    ("mlp", "up_proj", "kernel"): 1,  # (C, I)
    ("mlp", "down_proj", "kernel"): 0,  # (I, C)
}
# Parameters every stage holds (the rest of the tree is split over "pipe"), and those of them
# whose gradients the first and the last stage sum (see the module docstring); ``wte`` only when
# the last stage reads it too (a tied head).
SHARED = ("wte", "wpe", "ln_f", "lm_head")
PAIRED = ("wte", "ln_f", "lm_head")
# The values of a segment's piece are a multiple of ALIGN: whole blocks of ZFP (4 values) and of
# the block quantizers' default (q8, q4: 256), so no block of a codec that rows of the flat vector
# go through spans the shared parameters and a layer's (the end stages' copies of the shared
# parameters then get the same bits; a stage's layers differ from the other end stage's).
ALIGN = 256
# In a segment every parameter's values (a block parameter's: each layer's slice) start on a row
# of ROW values, zeros filling its last row: every row belongs to one parameter, so what is fixed
# per parameter is fixed per row (`FlatLayout.rows`), and sums per row fuse into one pass.
# (Rows of ALIGN would keep the quantizers' blocks apart too, at up to 255 zeros per parameter.)
ROW = 64
# Leaves that AdamW decays: matrices and embeddings, not biases or LayerNorm parameters.
DECAYED = ("kernel", "wte", "wpe", "lm_head")


def path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def leaf_spec(path, ndim: int) -> P:
    """The PartitionSpec of the parameter at `path` (a key path of the single layout)."""
    names = path_names(path)
    if names[0] != "blocks":
        return P()
    split = TENSOR_SPLIT.get(names[1:])
    inner = [None] * (ndim - 1)
    if split is not None:
        inner[split] = "tensor"
    return P("pipe", *inner)


def param_specs(params) -> dict:
    """PartitionSpecs of a parameter tree (arrays or shapes) in the single layout."""
    return jax.tree.map_with_path(lambda p, x: leaf_spec(p, len(x.shape)), params)


def decay_mask(params) -> dict:
    """True for the parameters AdamW decays."""
    return jax.tree.map_with_path(lambda p, _: path_names(p)[-1] in DECAYED, params)


def local_shape(shape, spec: P, mesh_cfg: MeshConfig) -> tuple[int, ...]:
    sizes = {"data": mesh_cfg.data, "tensor": mesh_cfg.tensor, "pipe": mesh_cfg.pipe}
    out = list(shape)
    for i, axis in enumerate(spec):
        if axis is not None:
            out[i] //= sizes[axis]
    return tuple(out)


def _round_up(n: int, q: int) -> int:
    return -(-n // q) * q


def segment_padded(values: int, data: int, align: int = ALIGN) -> int:
    """A segment of `values` values padded as `FlatLayout` pads each of its segments: to `data`
    equal pieces of whole codec blocks (`align` values: `ALIGN`, or `FlatLayout.align`).

    >>> segment_padded(1000, 2), segment_padded(512, 2)
    (1024, 512)
    """
    return _round_up(values, align * data)


def per_value(rows: jax.Array) -> jax.Array:
    """A per-row mask (`FlatLayout.rows`) as one value per stored element."""
    return jnp.broadcast_to(rows[:, None], (rows.shape[0], ROW)).reshape(-1)


class FlatLayout:
    """A rank's local parameters as one float32 vector that splits evenly over "data", laid out
    so that every data chunk holds a slice of every transformer layer.

    The vector is made of *segments*: the shared parameters (``wte``, ``wpe``, ``ln_f``, in tree
    order) and then each local layer's slice of the ``blocks`` leaves (in tree order). In a
    segment each parameter starts on a row of `ROW` values (zeros pad its last row), and the
    segment is padded to ``data`` equal pieces of whole codec blocks (`ALIGN`). The vector is
    stored *piece-major*: piece k of the shared segment, then piece k of layer 0, 1, ..., then
    piece k + 1 of each. Any chunk a reduce-scatter over the data (sub-)axes leaves a rank (a run
    of q whole pieces) is then, for each segment, that segment's own chunk: a layer's part of a
    chunk is a reshape and a slice (`split`), so a layer's parameters can be gathered on their own
    (`jaxhc.parallel.layers.layer_fetch`), with the same bits as gathering the whole vector.

    Each rank flattens the same local shapes in the same order, so element i of every rank's
    vector belongs to the same parameter. Per-parameter facts (decayed, split over which axes)
    become per-row masks with `rows`.

    `tensor_block` (used where "tensor" > 1; `jaxhc.parallel.state.tensor_block`): the values per
    block of the largest lossy block codec on "data". A block that held values of a parameter
    "tensor" splits (which differ between the tensor ranks) and of one it replicates would decode
    each rank's copy of the replicated one differently, and the copies would drift apart. So
    where one kind follows the other in a layer, the next parameter starts on a multiple of the
    block, and the pieces are whole blocks (`align` values): the replicated parameters' blocks
    hold the same values on every tensor rank and decode to the same bits. Without it (or with
    blocks that divide `ROW`, as ZFP's) the layout is the plain one.

    `piece_block` (`jaxhc.parallel.state.piece_block`: the largest block of the lossy data
    codecs): the pieces are whole blocks of it too, so a layer's piece, gathered or reduced on
    its own, codes as in the whole vector.
    """

    def __init__(
        self, global_shapes, mesh_cfg: MeshConfig, tensor_block: int = 0, piece_block: int = 0
    ):
        specs = param_specs(global_shapes)
        leaves, self.treedef = jax.tree.flatten(global_shapes)
        spec_leaves = self.treedef.flatten_up_to(specs)
        paths = [path_names(p) for p, _ in jax.tree.flatten_with_path(global_shapes)[0]]
        self.shapes = [
            local_shape(x.shape, s, mesh_cfg) for x, s in zip(leaves, spec_leaves, strict=True)
        ]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.size = sum(self.sizes)
        self.decayed = np.array([p[-1] in DECAYED for p in paths])
        self.split_over = [set(a for a in s if a is not None) for s in spec_leaves]
        self.data = mesh_cfg.data
        self.blocks_treedef = jax.tree.structure(global_shapes["blocks"])
        shared = {k: v for k, v in global_shapes.items() if k != "blocks"}
        self.shared_treedef = jax.tree.structure(shared)  # the tree's order, "blocks" left out
        block = [p[0] == "blocks" for p in paths]
        self.shared_leaves = [i for i, b in enumerate(block) if not b]
        self.block_leaves = [i for i, b in enumerate(block) if b]
        self.layers = self.shapes[self.block_leaves[0]][0]  # local layers (this stage's)
        # Per segment: the values of each of its leaves (a block leaf: one layer's slice), and
        # where they start (a multiple of ROW).
        self.shared_sizes = [self.sizes[i] for i in self.shared_leaves]
        self.layer_sizes = [self.sizes[i] // self.layers for i in self.block_leaves]
        apart = mesh_cfg.tensor > 1 and tensor_block > 1  # split and replicated blocks apart
        cut = math.lcm(ROW, tensor_block) if apart else ROW
        # The values a piece divides by: whole blocks of the codecs (ALIGN), with `tensor_block`
        # where split and replicated parameters are kept apart, and `piece_block`.
        self.align = math.lcm(ALIGN, tensor_block if apart else 1, max(piece_block, 1))
        split = ["tensor" in self.split_over[i] for i in self.block_leaves]
        self.shared_starts = self._starts(self.shared_sizes)  # all replicated over "tensor"
        self.layer_starts = self._starts(self.layer_sizes, split, cut)
        shared_values = self.shared_starts[-1] + _round_up(self.shared_sizes[-1], ROW)
        self.shared_padded = segment_padded(shared_values, mesh_cfg.data, self.align)
        self.layer_values = sum(self.layer_sizes)  # a layer's values, unpadded
        layer_rows = self.layer_starts[-1] + _round_up(self.layer_sizes[-1], ROW)
        self.layer_padded = segment_padded(layer_rows, mesh_cfg.data, self.align)
        # The width of a piece (one per data rank): its shared part, then each layer's part.
        self.shared_width = self.shared_padded // mesh_cfg.data
        self.layer_width = self.layer_padded // mesh_cfg.data
        self.chunk = self.shared_width + self.layers * self.layer_width
        self.padded = self.chunk * mesh_cfg.data

    @staticmethod
    def _starts(sizes, split=None, cut: int = ROW) -> list[int]:
        """Where each of a segment's parameters starts: on the row after the previous one's, on
        a multiple of `cut` where `split` (one flag per parameter) changes."""
        starts, at = [], 0
        for i, n in enumerate(sizes):
            if i and split is not None and split[i] != split[i - 1]:
                at = _round_up(at, cut)
            starts.append(at)
            at += _round_up(n, ROW)
        return starts

    # --- segments ---------------------------------------------------------------------------

    @staticmethod
    def _rows(flats, starts, total: int, axis: int):
        """`flats` (flattened along `axis`) placed at `starts` of a zero vector of `total`."""
        parts, at = [], 0
        for x, s in zip(flats, starts, strict=True):
            if s > at:
                parts.append(jnp.zeros((*x.shape[:axis], s - at), jnp.float32))
            parts.append(x.astype(jnp.float32))
            at = s + x.shape[axis]
        if total > at:
            parts.append(jnp.zeros((*flats[0].shape[:axis], total - at), jnp.float32))
        return jnp.concatenate(parts, axis=axis)

    def shared_flat(self, tree) -> jax.Array:
        """The padded shared segment of a parameter tree (its ``blocks`` are not read)."""
        leaves = self.shared_treedef.flatten_up_to({k: v for k, v in tree.items() if k != "blocks"})
        flats = [x.reshape(-1) for x in leaves]
        return self._rows(flats, self.shared_starts, self.shared_padded, 0)

    def shared_tree(self, seg: jax.Array) -> dict:
        """The shared parameters ({"wte", "wpe", "ln_f"}) of a padded shared segment."""
        leaves = [
            seg[s : s + n].reshape(self.shapes[i])
            for i, s, n in zip(
                self.shared_leaves, self.shared_starts, self.shared_sizes, strict=True
            )
        ]
        return self.shared_treedef.unflatten(leaves)

    def layer_flat(self, blocks, pad: bool = True) -> jax.Array:
        """The padded segments of stacked ``blocks`` (leading layer axis): (layers, padded);
        `pad` False: the layers' values without any padding, (layers, `layer_values`)."""
        leaves = [x.reshape(x.shape[0], -1) for x in self.blocks_treedef.flatten_up_to(blocks)]
        if not pad:
            return jnp.concatenate([x.astype(jnp.float32) for x in leaves], axis=1)
        return self._rows(leaves, self.layer_starts, self.layer_padded, 1)

    def pad_layers(self, values: jax.Array) -> jax.Array:
        """Layers' unpadded values (layers, `layer_values`) as their padded segments."""
        out = jnp.zeros((values.shape[0], self.layer_padded), jnp.float32)
        at = 0
        for s, n in zip(self.layer_starts, self.layer_sizes, strict=True):
            out = out.at[:, s : s + n].set(values[:, at : at + n])  # in place, slice fused
            at += n
        return out

    def layer_tree(self, segs: jax.Array) -> dict:
        """``blocks`` (stacked) from padded layer segments (..., padded): the inverse of
        `layer_flat`; a single segment gives one layer's parameters."""
        lead = segs.shape[:-1]
        leaves = [
            segs[..., s : s + n].reshape(*lead, *self.shapes[i][1:])
            for i, s, n in zip(self.block_leaves, self.layer_starts, self.layer_sizes, strict=True)
        ]
        return self.blocks_treedef.unflatten(leaves)

    # --- the stored (piece-major) order ---------------------------------------------------------

    def split(self, vec: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A run of whole pieces of the stored vector (a chunk of q pieces) as (the shared
        segment's part, (layers, each layer's part)), each in its segment's own order."""
        q = vec.shape[0] // self.chunk
        pieces = vec.reshape(q, self.chunk)
        shared = pieces[:, : self.shared_width].reshape(-1)
        layers = pieces[:, self.shared_width :].reshape(q, self.layers, self.layer_width)
        return shared, layers.transpose(1, 0, 2).reshape(self.layers, -1)

    def join(self, shared: jax.Array, layers: jax.Array) -> jax.Array:
        """The inverse of `split`."""
        q = shared.shape[0] // self.shared_width
        layers = layers.reshape(self.layers, q, self.layer_width).transpose(1, 0, 2)
        pieces = jnp.concatenate([shared.reshape(q, -1), layers.reshape(q, -1)], axis=1)
        return pieces.reshape(-1)

    def flatten(self, tree) -> jax.Array:
        return self.join(self.shared_flat(tree), self.layer_flat(tree["blocks"]))

    def unflatten(self, vec: jax.Array):
        shared, layers = self.split(vec)
        return {**self.shared_tree(shared), "blocks": self.layer_tree(layers)}

    def rows(self, flags, start, size: int) -> jax.Array:
        """flags[parameter of row r] for the rows of `ROW` stored values in [start, start + size),
        a run of whole pieces (`start` may be traced): (size // ROW,) bool; the rows
        of a segment's padding give False.

        `flags` has one static bool per parameter. In a segment's piece a parameter's rows are a
        range whose ends depend on the piece only: the mask is a few comparisons of row numbers
        with static bounds, nothing searched or gathered, and no per-value work at all.
        """
        flags = np.asarray(flags, bool)
        q = size // self.chunk
        piece = start // self.chunk + jnp.arange(q, dtype=jnp.int32)[:, None]

        def segment(leaves, starts, sizes, width):
            runs = []  # flagged parameters' rows [first, end) in the segment, adjacent ones merged
            for leaf, s, n in zip(leaves, starts, sizes, strict=True):
                first, end = s // ROW, -(-(s + n) // ROW)
                if not flags[leaf]:
                    continue
                if runs and runs[-1][1] == first:
                    runs[-1][1] = end
                else:
                    runs.append([first, end])
            per = width // ROW
            at = piece * per + jnp.arange(per, dtype=jnp.int32)  # rows of the segment
            out = jnp.zeros(at.shape, bool)
            for first, end in runs:
                out = out | ((at >= first) & (at < end))
            return out  # (q, width // ROW)

        shared = segment(
            self.shared_leaves, self.shared_starts, self.shared_sizes, self.shared_width
        )
        layer = segment(self.block_leaves, self.layer_starts, self.layer_sizes, self.layer_width)
        layers = jnp.broadcast_to(layer[:, None, :], (q, self.layers, layer.shape[1]))
        return jnp.concatenate([shared, layers.reshape(q, -1)], axis=1).reshape(-1)

    def owned_rows(self, tensor_rank, pipe_rank, start, size: int) -> jax.Array:
        """Per row of [start, start + size) (see `rows`): whether this rank counts it in the
        global gradient norm. A parameter replicated over an axis is counted on that axis'
        rank 0 only; a segment's padding rows never are."""
        over = [[axis in axes for axes in self.split_over] for axis in ("tensor", "pipe")]
        present = self.rows(np.ones(len(self.shapes), bool), start, size)
        tensor = self.rows(over[0], start, size) | (tensor_rank == 0)
        pipe = self.rows(over[1], start, size) | (pipe_rank == 0)
        return present & tensor & pipe

    def stored(self, start, size: int) -> jax.Array:
        """Per value of [start, start + size), a run of whole pieces (`start` may be traced):
        whether it is a parameter's value, not padding (a parameter's last row or a segment's
        end). Padding is zero in every flat vector of the train state, which a checkpoint does not
        store; a lossy codec may decode non-zero values there (a rotated block mixes them with
        the parameter's), which `jaxhc.parallel.zero` sets back to zero."""
        q = size // self.chunk
        piece = start // self.chunk + jnp.arange(q, dtype=jnp.int32)[:, None]

        def segment(starts, sizes, width):  # values stored in each row of the segment's pieces
            per = width // ROW
            at = piece * per + jnp.arange(per, dtype=jnp.int32)
            count = jnp.zeros(at.shape, jnp.int32)
            for s, n in zip(starts, sizes, strict=True):
                first, last = s // ROW, (s + n - 1) // ROW
                count = jnp.where((at >= first) & (at < last), ROW, count)
                count = jnp.where(at == last, s + n - last * ROW, count)
            return count  # (q, width // ROW)

        shared = segment(self.shared_starts, self.shared_sizes, self.shared_width)
        layer = segment(self.layer_starts, self.layer_sizes, self.layer_width)
        layers = jnp.broadcast_to(layer[:, None, :], (q, self.layers, layer.shape[1]))
        count = jnp.concatenate([shared, layers.reshape(q, -1)], axis=1).reshape(-1)
        return (jnp.arange(ROW, dtype=jnp.int32)[None, :] < count[:, None]).reshape(-1)

    def runs(self, lo: int, hi: int):
        """The stored elements [lo, hi) as runs of one parameter each, padding left out:
        (position, leaf, offset in the leaf's local flattened values, length). On the host."""
        segments = [
            (self.shared_leaves, self.shared_starts, self.shared_sizes, self.shared_width),
            *[(self.block_leaves, self.layer_starts, self.layer_sizes, self.layer_width)]
            * self.layers,
        ]
        for piece in range(lo // self.chunk, -(-hi // self.chunk)):
            at = piece * self.chunk
            for seg, (seg_leaves, starts, sizes, w) in enumerate(segments):
                a, b = max(lo, at), min(hi, at + w)  # stored positions of this segment's piece
                e0 = piece * w + a - at  # their element offsets in the segment
                for leaf, s, n in zip(seg_leaves, starts, sizes, strict=True):
                    x, y = max(e0, s), min(e0 + b - a, s + n)
                    if x < y:
                        base = (seg - 1) * n if seg else 0  # the layer's slice
                        yield a + x - e0, leaf, base + x - s, y - x
                at += w
