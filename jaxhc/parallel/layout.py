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
it splits into equal chunks over "data".
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
    """A rank's local parameters as one float32 vector, padded to split evenly over "data".

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
        quantum = 4 * mesh_cfg.data  # whole ZFP blocks in every data chunk
        self.padded = -(-self.size // quantum) * quantum
        self.chunk = self.padded // mesh_cfg.data
        self.ends = np.cumsum(self.sizes)
        self.decayed = np.array([p[-1] in DECAYED for p in paths])
        self.split_over = [set(a for a in s if a is not None) for s in spec_leaves]

    def flatten(self, tree) -> jax.Array:
        flat = [x.reshape(-1).astype(jnp.float32) for x in self.treedef.flatten_up_to(tree)]
        return jnp.pad(jnp.concatenate(flat), (0, self.padded - self.size))

    def unflatten(self, vec: jax.Array):
        starts = np.concatenate([[0], self.ends[:-1]])
        leaves = [
            vec[s : s + n].reshape(shape)
            for s, n, shape in zip(starts, self.sizes, self.shapes, strict=True)
        ]
        return self.treedef.unflatten(leaves)

    def per_element(self, values, start, size: int) -> jax.Array:
        """values[leaf of element i] for i in [start, start + size); padding gets values[-1].

        `values` has one entry per parameter plus one for the padding.
        """
        idx = start + jnp.arange(size)
        leaf = jnp.searchsorted(jnp.asarray(self.ends), idx, side="right")
        return jnp.asarray(values)[leaf]

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
