"""A plan as the planner sees it (`Layout`), the device's share of the model under it, and
whether the plan can run at all (`check_layout`) and whether `jaxhc train` takes it.

A plan: data x tensor x pipe devices (the mesh is data-major, pipe innermost, so a data rank's
tensor x pipe devices sit next to each other), the AMSP sizes s_p <= s_g <= s_os over the data
axis nested in `levels` (group sizes, innermost first, ending with data), the codec of the data
levels that cross nodes, the precision and whether layers are recomputed.
"""

from __future__ import annotations

import dataclasses
import functools

from jaxhc import partition
from jaxhc.parallel.amsp import gathers_per_layer
from jaxhc.plan.shapes import ModelShape

__all__ = [
    "PRECISIONS",
    "Layout",
    "check_layout",
    "device_params",
    "device_segments",
    "tokens_per_microbatch",
    "trainable",
]

PRECISIONS = {  # bytes per value: params, grads (and what they move as), activations
    "float32": (4, 4, 4),
    "mixed": (2, 2, 2),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """One plan: the mesh, the AMSP sizes (s_p, s_g, s_os), the nested data groups, the codec on
    the levels that cross nodes, precision, recomputation, gathering and transport.

    >>> lay = jaxhc.plan.Layout(data=8, tensor=1, pipe=1, microbatches=1, params=1, grads=8,
    ...                         optim=8, levels=(8,))       # jaxhc's ZeRO on a flat data axis
    >>> lay.sizes
    (1, 8, 8)
    """

    data: int
    tensor: int
    pipe: int
    microbatches: int
    params: int  # s_p
    grads: int  # s_g
    optim: int  # s_os
    levels: tuple[int, ...]  # nested data group sizes, innermost first, ending with data
    codec: str = "none"  # for the data levels whose group crosses nodes
    precision: str = "float32"
    recompute: bool = False
    gather: str = "layer"  # float32, s_p > 1: ``mesh.shard.gather`` (per layer or whole; the
    # planner does not count ``keep``, which `check_layout` refuses)
    transport: str = "xla"  # how the collectives run: "xla" or "mpi" (`--transport`)
    overlap: bool = True  # ``train.overlap``: gradients reduced per layer in the backward

    @property
    def per_layer(self) -> bool:
        """Whether jaxhc's step (float32) gathers sharded parameters layer by layer: the
        runtime's rule (`jaxhc.parallel.amsp.gathers_per_layer`); mixed precision is AMSP's."""
        return self.precision == "float32" and gathers_per_layer(self.params, self.gather)

    @property
    def sizes(self) -> tuple[int, int, int]:
        return (self.params, self.grads, self.optim)

    @property
    def factors(self) -> tuple[int, ...]:
        """The levels' own sizes, innermost first."""
        return tuple(h // lo for lo, h in zip((1, *self.levels), self.levels, strict=False))

    def axis(self, i: int) -> str:
        """jaxhc's name of level i (0 innermost): "data" alone, else data.0 outermost."""
        return partition.data_axes(len(self.levels))[-1 - i]

    @property
    def groups(self) -> tuple[int, ...]:
        """``mesh.shard.groups`` (the levels below data)."""
        return self.levels[:-1]

    def mesh_overrides(self) -> dict:
        shard = {
            "params": self.params,
            "grads": self.grads,
            "optim": self.optim,
            "groups": list(self.groups),
            "gather": self.gather,
        }
        return {
            "data": self.data,
            "tensor": self.tensor,
            "pipe": self.pipe,
            "microbatches": self.microbatches,
            "shard": shard,
        }


@functools.lru_cache(maxsize=256)
def _flat_layout(gpt, data: int, tensor: int, pipe: int, codec: str):
    """The runtime's flat layout of a plan (`jaxhc.parallel.state.flat_layout`). Its codec
    blocks are the largest lossy block among the codecs of every data level
    (`jaxhc.Policy.data_codecs`), whichever level sends them and however the data axis nests:
    a codec spec on the whole data axis gives the layout of the run's policy, which puts it on
    the levels that cross nodes only (`jaxhc.plan.cost.spec_policy`), whenever one does, as on
    every plan the search prices with a codec (tests/test_plan_memory.py checks both routes)."""
    from jaxhc.model import gpt as gpt_model
    from jaxhc.model.config import MeshConfig
    from jaxhc.parallel.state import flat_layout
    from jaxhc.policy import Policy

    mesh = MeshConfig(data=data, tensor=tensor, pipe=pipe)
    if codec.startswith("policy "):  # the policy the plan's traffic is priced under
        policy = Policy.load(codec.removeprefix("policy "))
    else:  # a codec on the data levels that cross nodes
        policy = Policy.from_dict({"axes": {"data": codec}})
    return flat_layout(gpt_model.param_shapes(gpt), mesh, policy)


def device_params(shape: ModelShape, lay: Layout) -> tuple[int, int]:
    """(parameters on the device, its padded flat vector): exact (jaxhc's layout) for a model
    jaxhc trains in float32, else `ModelShape.device_params` and the sum of the padded segments
    `device_segments` gives."""
    if shape.gpt is not None and lay.precision == "float32":
        fl = _flat_layout(shape.gpt, lay.data, lay.tensor, lay.pipe, lay.codec)
        return fl.size, fl.padded
    shared, layer, layers = _shape_segments(shape, lay)
    return shape.device_params(lay.tensor, lay.pipe), shared + layers * layer


def device_segments(shape: ModelShape, lay: Layout) -> tuple[int, int, int]:
    """(shared segment, one layer's segment, local layers) of the device's flat vector, padded
    values (`jaxhc.parallel.layout.FlatLayout`): exact for a model jaxhc trains in float32,
    else its segments padded by FlatLayout's rule (`jaxhc.parallel.layout.segment_padded`, the
    default codec blocks; no parameter's row padding): the shared parameters (all but the
    layers' of `ModelShape.device_params`) and a layer's share of the tensor split."""
    if shape.gpt is not None and lay.precision == "float32":
        fl = _flat_layout(shape.gpt, lay.data, lay.tensor, lay.pipe, lay.codec)
        return fl.shared_padded, fl.layer_padded, fl.layers
    return _shape_segments(shape, lay)


def _shape_segments(shape: ModelShape, lay: Layout) -> tuple[int, int, int]:
    """`device_segments` of a model known by its shapes only (or counted in mixed precision):
    the one rule `device_params` sums too."""
    from jaxhc.parallel.layout import segment_padded

    layers = shape.layers // lay.pipe
    one = -(-shape.layer_params() // lay.tensor)
    shared = max(shape.device_params(lay.tensor, lay.pipe) - layers * one, 0)
    return segment_padded(shared, lay.data), segment_padded(one, lay.data), layers


def tokens_per_microbatch(lay: Layout, batch: int, seq: int) -> tuple[int, int]:
    """(sequences, tokens) of one micro-batch on one data rank."""
    b = batch // (lay.data * lay.microbatches)
    return b, b * seq


def check_layout(shape: ModelShape, lay: Layout, batch: int) -> str:
    """Why the plan cannot run at all ("" when it can): one line naming the rule."""
    if shape.heads % lay.tensor:
        return f"tensor={lay.tensor} does not divide heads={shape.heads}"
    if shape.layers % lay.pipe:
        return f"pipe={lay.pipe} does not divide layers={shape.layers}"
    if batch % (lay.data * lay.microbatches):
        return (
            f"batch {batch} is not divisible by data {lay.data} x microbatches {lay.microbatches}"
        )
    if lay.gather not in ("layer", "whole"):
        return f"gather={lay.gather!r}: the planner counts gather layer or whole"
    s_p, s_g, s_os = lay.sizes
    if not (lay.data % s_os == 0 and s_os % s_g == 0 and s_g % s_p == 0):
        return f"s_p={s_p} | s_g={s_g} | s_os={s_os} | data={lay.data} must each divide the next"
    if s_g not in (s_p, s_os):
        return f"s_g={s_g} must equal s_p={s_p} or s_os={s_os} (AMSP)"
    for s in lay.sizes:
        if s not in (1, *lay.levels):
            return f"size {s} is not 1 or one of the levels {list(lay.levels)}"
    if shape.gpt is not None:
        from jaxhc.model.config import MeshConfig, validate

        try:
            validate(
                shape.gpt,
                MeshConfig(lay.data, lay.tensor, lay.pipe, lay.microbatches),
                batch_size=batch,
            )
        except ValueError as e:
            return str(e)
    return ""


def trainable(shape: ModelShape, lay: Layout) -> str:
    """Whether `jaxhc train` takes the plan: "yes", or why not (the trainer's own refusal)."""
    if shape.gpt is None:
        return "shapes only"
    from jaxhc.model.config import ShardConfig

    try:
        ShardConfig(*lay.sizes, groups=lay.groups).resolve(lay.data)
    except ValueError as e:
        return f"no: {e}"
    if lay.precision != "float32":
        return "not as counted (jaxhc trains float32)"
    return "yes"
