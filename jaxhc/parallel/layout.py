"""Where each parameter lives on the ("data", "tensor", "pipe") mesh, and the flat ZeRO vector.

Every mesh holds the same global parameter arrays (the single layout of `jaxhc.model.gpt`):

* ``blocks/*``: the leading layer axis is split over "pipe" into contiguous stages; Megatron splits
  over "tensor" the heads of ``attn/c_attn`` and ``attn/c_proj.kernel`` and the hidden units of
  ``mlp/c_fc`` and ``mlp/c_proj.kernel``. LayerNorms and the row-parallel biases are replicated
  over "tensor".
* ``wte``, ``wpe``, ``ln_f`` (`SHARED`): replicated over "tensor" and "pipe", but each is read
  by some stages only: the first embeds (``wte``, ``wpe``), the last applies ``ln_f`` and the head
  tied to ``wte``. The first stage holds the canonical copy of all three (the one the gradient
  norm counts, a checkpoint writes and `jaxhc.parallel.params_to_single` returns): ``wte`` and
  ``ln_f`` (`PAIRED`) have their gradients summed over the pair of end stages, so both ends
  update the same bits; ``wpe`` needs no sum (but joins the pair under a lossy data codec: see
  `jaxhc.parallel.step._paired`). The middle stages' copies (and the last stage's ``wpe``) get
  zero gradients: stale copies that no stage reads and no reader takes.
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
}
# Parameters every stage holds (the rest of the tree is split over "pipe"), and those of them
# whose gradients the first and the last stage sum (see the module docstring).
SHARED = ("wte", "wpe", "ln_f")
PAIRED = ("wte", "ln_f")
# The values of a segment's piece are a multiple of ALIGN: whole blocks of ZFP (4 values) and of
# the block quantizers' default (q8, q4: 256), so no block of a codec that rows of the flat vector
# go through spans the shared parameters and a layer's (the end stages' copies of the shared
# parameters then get the same bits; a stage's layers differ from the other end stage's).
ALIGN = 256
# Leaves that AdamW decays: matrices and embeddings, not biases or LayerNorm parameters.
DECAYED = ("kernel", "wte", "wpe")


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


class FlatLayout:
    """A rank's local parameters as one float32 vector that splits evenly over "data", laid out
    so that every data chunk holds a slice of every transformer layer.

    The vector is made of *segments*: the shared parameters (``wte``, ``wpe``, ``ln_f``, in tree
    order) and then each local layer's slice of the ``blocks`` leaves (in tree order), every
    segment padded to ``data`` equal pieces of whole codec blocks (`ALIGN`). The vector is stored
    *piece-major*: piece k of the shared segment, then piece k of layer 0, 1, ..., then piece
    k + 1 of each. Any chunk a reduce-scatter over the data (sub-)axes leaves a rank (a run of q
    whole pieces) is then, for each segment, that segment's own chunk: a layer's part of a chunk
    is a reshape and a slice (`split`), so a layer's parameters can be gathered on their own
    (`jaxhc.parallel.zero.gather_layers`), with the same bits as gathering the whole vector.

    Each rank flattens the same local shapes in the same order, so element i of every rank's
    vector belongs to the same parameter. Per-parameter facts (decayed, split over which axes)
    become per-element values with `per_element`.
    """

    def __init__(self, global_shapes, mesh_cfg: MeshConfig):
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
        # Per segment: the leaves' sizes in it (a block leaf: one layer's slice), their ends.
        self.shared_ends = np.cumsum([self.sizes[i] for i in self.shared_leaves])
        self.layer_ends = np.cumsum([self.sizes[i] // self.layers for i in self.block_leaves])
        quantum = ALIGN * mesh_cfg.data  # pieces of whole codec blocks (see ALIGN)
        self.shared_padded = -(-int(self.shared_ends[-1]) // quantum) * quantum
        self.layer_values = int(self.layer_ends[-1])  # a layer's values, unpadded
        self.layer_padded = -(-self.layer_values // quantum) * quantum
        # The width of a piece (one per data rank): its shared part, then each layer's part.
        self.shared_width = self.shared_padded // mesh_cfg.data
        self.layer_width = self.layer_padded // mesh_cfg.data
        self.chunk = self.shared_width + self.layers * self.layer_width
        self.padded = self.chunk * mesh_cfg.data

    # --- segments ---------------------------------------------------------------------------

    def shared_flat(self, tree) -> jax.Array:
        """The padded shared segment of a parameter tree (its ``blocks`` are not read)."""
        leaves = self.shared_treedef.flatten_up_to({k: v for k, v in tree.items() if k != "blocks"})
        flat = jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in leaves])
        return jnp.pad(flat, (0, self.shared_padded - flat.shape[0]))

    def shared_tree(self, seg: jax.Array) -> dict:
        """The shared parameters ({"wte", "wpe", "ln_f"}) of a padded shared segment."""
        starts = [0, *self.shared_ends[:-1]]
        leaves = [
            seg[s:e].reshape(self.shapes[i])
            for i, s, e in zip(self.shared_leaves, starts, self.shared_ends, strict=True)
        ]
        return self.shared_treedef.unflatten(leaves)

    def layer_flat(self, blocks, pad: bool = True) -> jax.Array:
        """The padded segments of stacked ``blocks`` (leading layer axis): (layers, padded);
        `pad` False: without the padding, (layers, `layer_values`)."""
        leaves = self.blocks_treedef.flatten_up_to(blocks)
        n = leaves[0].shape[0]
        flat = jnp.concatenate([x.reshape(n, -1).astype(jnp.float32) for x in leaves], axis=1)
        if not pad:
            return flat
        return jnp.pad(flat, ((0, 0), (0, self.layer_padded - flat.shape[1])))

    def layer_tree(self, segs: jax.Array) -> dict:
        """``blocks`` (stacked) from padded layer segments (..., padded): the inverse of
        `layer_flat`; a single segment gives one layer's parameters."""
        lead = segs.shape[:-1]
        starts = [0, *self.layer_ends[:-1]]
        leaves = [
            segs[..., s:e].reshape(*lead, *self.shapes[i][1:])
            for i, s, e in zip(self.block_leaves, starts, self.layer_ends, strict=True)
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

    def per_element(self, values, start, size: int) -> jax.Array:
        """values[leaf of element i] for i in [start, start + size); padding gets values[-1].

        `values` has one entry per parameter plus one for the padding.
        """
        idx = start + jnp.arange(size)
        piece, at = idx // self.chunk, idx % self.chunk
        pad = len(self.shapes)
        shared = jnp.searchsorted(
            jnp.asarray(self.shared_ends), piece * self.shared_width + at, side="right"
        )
        rest = jnp.maximum(at - self.shared_width, 0) % self.layer_width
        layer = jnp.searchsorted(
            jnp.asarray(self.layer_ends), piece * self.layer_width + rest, side="right"
        )
        shared = jnp.asarray([*self.shared_leaves, pad])[shared]
        layer = jnp.asarray([*self.block_leaves, pad])[layer]
        return jnp.asarray(values)[jnp.where(at < self.shared_width, shared, layer)]

    def runs(self, lo: int, hi: int):
        """The stored elements [lo, hi) as runs of one parameter each, padding left out:
        (position, leaf, offset in the leaf's local flattened values, length). On the host."""
        ends = [self.shared_ends, *([self.layer_ends] * self.layers)]
        leaves = [self.shared_leaves, *([self.block_leaves] * self.layers)]
        widths = [self.shared_width, *([self.layer_width] * self.layers)]
        for piece in range(lo // self.chunk, -(-hi // self.chunk)):
            at = piece * self.chunk
            for seg, (seg_ends, seg_leaves, w) in enumerate(zip(ends, leaves, widths, strict=True)):
                a, b = max(lo, at), min(hi, at + w)  # stored positions of this segment's piece
                e0 = piece * w + a - at  # their element offsets in the segment
                starts = [0, *seg_ends[:-1]]
                for leaf, s, e in zip(seg_leaves, starts, seg_ends, strict=True):
                    x, y = max(e0, int(s)), min(e0 + b - a, int(e))
                    if x < y:
                        base = (seg - 1) * (int(e) - int(s)) if seg else 0  # the layer's slice
                        yield a + x - e0, leaf, base + x - int(s), y - x
                at += w

    def owned(self, tensor_rank, pipe_rank) -> jax.Array:
        """Per parameter (plus padding): whether this rank counts it in the global gradient norm.

        A parameter replicated over an axis is counted on that axis' rank 0 only.
        """
        flags = []
        for axes in self.split_over:
            mine = jnp.asarray(True)
            if "tensor" not in axes:
                mine = mine & (tensor_rank == 0)
            if "pipe" not in axes:
                mine = mine & (pipe_rank == 0)
            flags.append(mine)
        return jnp.stack([*flags, jnp.asarray(False)])
