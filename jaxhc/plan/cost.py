"""Memory per device and the collectives per step of one plan (a `Layout`) on a `Cluster`.

Memory (bytes per device; psi = the device's parameters, its tensor x pipe block):
  float32 (jaxhc): P = 4 psi (s_p = 1: the parameter tree) or 4 psi_pad / s_p (its chunk of the
                   padded flat vector: its segments, the shared parameters and each layer, in
                   data pieces of whole codec blocks; a model known by its shapes: each
                   segment so padded, `jaxhc.plan.layout.device_segments`), G = 4 psi_pad /
                   s_g (the reduced chunk, a temporary), OS = 12 psi_pad / s_os (two AdamW
                   moments and the master copy) + 8,
                   with error feedback + 4 x the residual of every reduce-scatter level (the
                   vector it sends: psi_pad innermost, 1/(the inner levels' ranks) of it further
                   out); psi, for a model jaxhc trains, its flat layout's count: the count of
                   `jaxhc.plan.memory.flat_bytes`, which `state_bytes` makes of the runtime's
                   plan too (equal to the compiled step's to the byte)
  mixed (AMSP):    P = 2 psi / s_p, G = 2 psi / s_g, OS = 12 psi / s_os (`amsp_bytes`)
  activations:     per layer and micro-batch `ModelShape.activation_bytes` (+ the softmax
                   probabilities without recomputation, unless the cluster's
                   ``schedule.attention`` is fused), for layers / pipe layers and every
                   micro-batch in flight (GPipe keeps all m; without a pipeline one); with
                   recomputation each layer keeps its input only, plus one layer's full set
  temporaries:     logits and their gradient (float32, vocab / tensor per token of a micro-batch);
                   float32: the whole unreduced gradient 4 psi_pad (jaxhc's step reduces it at
                   the end), and for s_p > 1 the whole gathered parameter vector 4 psi_pad
                   (``gather: whole``) or the gathered shared parameters and two layers' (per
                   layer: the one in use and its backward's re-gather);
                   mixed: one layer's gradient (a bucket), and for s_p > 1 two layers' gathered
                   parameters (the one in use and the next)

Collectives per step, per device (ring algorithms; n the bytes of the flat vector in the
precision moved: 4 psi float32, 2 psi mixed), level by level over the nested data axis:
  param gather (s_p > 1):   all-gather n / s_p -> n over the levels inside s_p, outermost first;
                            float32 (jaxhc), ``gather: whole``: once per step, the whole vector
                            for the forward (its reverse mode is the gradients' reduce-scatter):
                            (s_p - 1) / s_p n; per layer (the default): the shared segment once,
                            each layer's forward and again backward, every micro-batch (L
                            messages per pass instead of one), the gradients reduce-scattered
                            per layer over s_p's levels;
                            mixed (ZeRO-3 style, layer by layer): forward and backward, every
                            micro-batch: 2 m (s_p - 1) / s_p n
  grad reduce-scatter:      level by level, innermost first, to n / data, once per step (mixed
                            with s_g > 1: over the levels inside s_g every micro-batch, as a
                            sharded gradient keeps only its chunk of the sum; a replicated one,
                            s_g = 1, sums the micro-batches locally); then the
                            all-gather back over the levels outside the gradient group (there a
                            hierarchical all-reduce): (k - 1)/k n per level as n shrinks k-fold
  param exchange:           the updated OS chunk all-gathered over the levels inside s_os and
                            outside s_p: (k - 1) x chunk per level
  tensor (Megatron):        per layer and micro-batch 4 all-reduces (2 forward, 2 backward) of
                            the micro-batch's activations, 2 (t - 1)/t x tokens x width x e each
  pipe:                     per micro-batch one activation forward and one gradient back,
                            tokens x width x e each, (p - 1)/p of it per device on average (the
                            end stages send one way); and the end stages' exchange of the
                            gradients both keep (GPT-2: the tied embedding and the final norm,
                            the positions too under a lossy data grad codec), each sending
                            their bytes once: 2/p of them per device on average
The data axis's come from `jaxhc.plan.steps.data_steps`, the rule by which
`jaxhc.plan.traffic.data_collectives` counts the ledger's bytes too (in float32 the same
bytes, tested). A cluster's ``schedule`` (`jaxhc.plan.cluster`) may run them as AMSP does instead:
``gradients: all_reduce``: a replicated gradient (s_g = 1) all-reduced whole over the data axis
(one psum of data ranks), a sharded one reduce-scattered over the levels inside s_os and then
all-reduced over the chunk's data / s_os replicas (one psum, its ranks s_os apart), no gathers
back; ``exchange: broadcast``: per level of the exchange, each of its k members broadcasts its
chunk (k broadcasts of the chunk, uncompressed).

The time of each collective is `jaxhc.plan.comm.Comm`'s; a step's time, its compute and the
communication it hides, `jaxhc.plan.steptime`'s.
"""

from __future__ import annotations

import dataclasses
import functools

from jaxhc.codecs import parse
from jaxhc.parallel.grads import pairs
from jaxhc.plan.cluster import Cluster
from jaxhc.plan.comm import Comm, dtype_of, native
from jaxhc.plan.layout import (
    PRECISIONS,
    Layout,
    device_params,
    device_segments,
    tokens_per_microbatch,
)
from jaxhc.plan.memory import amsp_bytes, flat_bytes
from jaxhc.plan.shapes import ModelShape
from jaxhc.plan.steps import data_steps

__all__ = [
    "Memory",
    "codec_by_policy",
    "codec_by_spec",
    "collectives",
    "crosses_nodes",
    "error_feedback",
    "keeps_own",
    "memory",
    "spec_axes",
    "spec_policy",
]


@dataclasses.dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optim: int
    activations: int
    temporaries: int

    @property
    def state(self) -> int:
        return self.params + self.optim

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim + self.activations + self.temporaries


def memory(
    shape: ModelShape,
    lay: Layout,
    batch: int,
    seq: int,
    error_feedback: bool = False,
    attention: str = "materialized",
) -> Memory:
    """Per device; `error_feedback`: the data levels' grad codec keeps residuals (float32: OS);
    `attention` "fused": no layer keeps its softmax probabilities (``schedule.attention``)."""
    ep, eg, ea = PRECISIONS[lay.precision]
    size, padded = device_params(shape, lay)
    if lay.precision == "float32":  # a residual per reduce-scatter level with error feedback
        state = flat_bytes(size, padded, lay, lay.factors if error_feedback else ())
    else:
        state = amsp_bytes(padded, lay)
    b, tok = tokens_per_microbatch(lay, batch, seq)
    t, layers = lay.tensor, shape.layers // lay.pipe
    full = shape.activation_bytes(tok, t, ea, False)
    if attention != "fused":
        full += shape.attention_bytes(b, seq, t, ea)
    inflight = lay.microbatches if lay.pipe > 1 else 1
    if lay.recompute:
        act = inflight * layers * shape.activation_bytes(tok, t, ea, True) + full
    else:
        act = inflight * layers * full
    layer = -(-shape.layer_params() // t)
    temp = 2 * 4 * tok * -(-shape.vocab // t)
    if lay.per_layer:  # the unreduced gradient, the gathered shared parameters and layers (the
        shared, one, _ = device_segments(shape, lay)  # one in use, its backward's re-gather)
        temp += 4 * (padded + shared + 2 * one)
    elif lay.precision == "float32":  # the unreduced gradient; s_p > 1: the gathered parameters
        temp += 4 * padded * (2 if lay.params > 1 else 1)
    else:  # a layer's gradient bucket; s_p > 1: the layer in use and the next, gathered
        temp += eg * layer + (2 * ep * layer if lay.params > 1 else 0)
    return Memory(state.params, state.grads, state.optim, act, temp)


def crosses_nodes(lay: Layout, i: int, cluster: Cluster) -> bool:
    """Whether the group of data level i (0 innermost; its ranks tensor x pipe devices apart)
    spans more than one of `cluster`'s nodes."""
    return lay.levels[i] * lay.tensor * lay.pipe > cluster.devices_per_node


def spec_axes(lay: Layout, cluster: Cluster) -> dict[str, str]:
    """`codec_by_spec`'s choice for `lay.codec` as a policy's ``axes``: the codec on every data
    level of more than one rank whose group crosses nodes (`crosses_nodes`)."""
    return {
        lay.axis(i): lay.codec
        for i, k in enumerate(lay.factors)
        if k > 1 and crosses_nodes(lay, i, cluster)
    }


def spec_policy(spec: str, lay: Layout, cluster: Cluster) -> dict | None:
    """The policy mapping a plan of `lay` runs under codec `spec` (as a plan file writes it):
    `spec` on the levels `spec_axes` names, nothing elsewhere; None for no codec."""
    codec = parse(spec)
    if codec is None or codec.spec == "none":
        return None
    return _policy_mapping(spec, tuple(spec_axes(lay, cluster)))


def _policy_mapping(spec: str, axes: tuple[str, ...]) -> dict:
    return {"name": "plan", "min_bytes": 0, "axes": dict.fromkeys(axes, spec)}


def codec_by_spec(spec: str):
    """The planner's choice: `spec` on the data levels that cross nodes (`spec_axes`, as
    `collectives` asks it with `crosses_nodes`), nothing elsewhere."""
    codec = parse(spec)
    if codec is not None and codec.spec == "none":
        codec = None

    def of(axis, kind, itemsize, nbytes, inter):
        return codec if inter and kind in ("grad", "param") else None

    def policy(lay: Layout, cluster: Cluster):  # the policy a plan of `lay` runs
        return None if codec is None else _spec_policy(spec, tuple(spec_axes(lay, cluster)))

    of.policy = policy
    return of


@functools.lru_cache(maxsize=1024)
def _spec_policy(spec: str, axes: tuple[str, ...]):
    """The `jaxhc.policy.Policy` of `spec_policy`, made once per codec and levels (a search asks
    it for every plan)."""
    from jaxhc.policy import Policy

    return Policy.from_dict(_policy_mapping(spec, axes))


def codec_by_policy(policy):
    """A jaxhc policy's choice per axis and kind (``min_bytes`` and dtype rules as the
    collectives apply them)."""
    from jaxhc.policy import Policy

    pol = Policy.load(policy)

    def of(axis, kind, itemsize, nbytes, inter):
        codec = pol.codec_for(axis, kind, dtype_of(itemsize))
        if codec is None or not codec.supports(dtype_of(itemsize)) or nbytes < pol.min_bytes:
            return None
        return codec

    of.policy = lambda lay, cluster: pol
    return of


def error_feedback(lay: Layout, cluster: Cluster, codec_of=None) -> bool:
    """Whether a plan of `lay` keeps error-feedback residuals in its train state: the trainer's
    rule (`jaxhc.parallel.state.error_feedback`) under the policy the plan runs (`codec_of`'s
    ``policy``; `codec_by_spec`'s for ``lay.codec`` by default). A policy the trainer refuses
    for this plan (error feedback on tensor or pipe) is its one-line ValueError."""
    from jaxhc.model.config import MeshConfig
    from jaxhc.parallel.state import error_feedback as state_error_feedback

    policy = _policy(lay, cluster, codec_of)
    return state_error_feedback(policy, MeshConfig(lay.data, lay.tensor, lay.pipe))


def keeps_own(lay: Layout, cluster: Cluster, codec_of=None) -> bool:
    """Whether a plan of `lay` has error feedback (`error_feedback`) whose reduce-scatters add
    each rank's own slice uncoded (the policy's ``keep_own``, `jaxhc.parallel.grads.keeps_own`):
    then the trainer does not overlap the reduction (`jaxhc.parallel.grads.overlaps`)."""
    from jaxhc.parallel.grads import keeps_own as policy_keeps_own

    axes = [lay.axis(i) for i in range(len(lay.levels))]
    own = policy_keeps_own(_policy(lay, cluster, codec_of), axes)
    return own and error_feedback(lay, cluster, codec_of)


def _policy(lay: Layout, cluster: Cluster, codec_of=None):
    """The policy a plan of `lay` runs under `codec_of` (`codec_by_spec(lay.codec)` by
    default; None for a choice that names none)."""
    codec_of = codec_of or codec_by_spec(lay.codec)
    return codec_of.policy(lay, cluster) if hasattr(codec_of, "policy") else None


def collectives(
    shape: ModelShape, lay: Layout, batch: int, seq: int, cluster: Cluster, codec_of=None
) -> list[Comm]:
    """The collectives of one step on one device, in the order the step runs them.

    >>> lay = jaxhc.plan.Layout(data=8, tensor=1, pipe=1, microbatches=1, params=1, grads=8,
    ...                         optim=8, levels=(8,))
    >>> shape = jaxhc.plan.load_shape("gpt2-small")
    >>> cluster = jaxhc.plan.cluster.local(devices=8, memory_gib=16)
    >>> [(c.op, c.kind) for c in jaxhc.plan.collectives(shape, lay, 8, 1024, cluster)]
    [('psum_scatter', 'grad'), ('all_gather', 'param')]
    """
    codec_of = codec_of or codec_by_spec(lay.codec)
    feedback = error_feedback(lay, cluster, codec_of)
    ep, eg, ea = PRECISIONS[lay.precision]
    _, padded = device_params(shape, lay)
    tp = lay.tensor * lay.pipe
    m = lay.microbatches
    factors, per_node = lay.factors, cluster.devices_per_node
    segments = device_segments(shape, lay) if lay.per_layer else None
    steps = data_steps(
        lay.factors,
        lay.sizes,
        padded,
        segments,
        microbatches=m,
        layerwise=lay.precision != "float32",
        all_reduce=cluster.gradients == "all_reduce",
        broadcast=cluster.exchange == "broadcast",
    )
    out: list[Comm] = []
    for s in steps:  # the data levels' collectives (`jaxhc.plan.steps`): codecs and links
        itemsize = ep if s.kind == "param" else eg
        axis = lay.axis(s.level)
        span = s.group * tp
        inter = crosses_nodes(lay, s.level, cluster)  # span > per_node
        codec = codec_of(axis, s.kind, itemsize, s.message * itemsize, inter)
        codec = None if s.op == "broadcast" else codec  # jaxhc has no compressed broadcast
        members = _members(s.ranks, s.inner * tp, per_node)
        # the reductions carry the residuals (`jaxhc.parallel.zero.reduce_gradients`)
        residual = feedback and s.kind == "grad" and s.op in ("psum_scatter", "psum")
        fused = _fused(lay, codec, s.op, itemsize, residual)
        out.append(
            Comm(
                axis,
                s.kind,
                s.op,
                s.ranks,
                span,
                s.message,
                itemsize,
                s.count,
                codec,
                members,
                fused,
                s.role,
                residual,
            )
        )
    b, tok = tokens_per_microbatch(lay, batch, seq)
    act = tok * shape.width
    if lay.tensor > 1:
        codec = codec_of("tensor", "act", ea, act * ea, tp > cluster.devices_per_node)
        count = 4 * m * shape.layers // lay.pipe
        members = _members(lay.tensor, lay.pipe, cluster.devices_per_node)
        fused = _fused(lay, codec, "psum", ea)
        out.append(
            Comm("tensor", "act", "psum", lay.tensor, tp, act, ea, count, codec, members, fused)
        )
    if lay.pipe > 1:
        codec = codec_of("pipe", "act", ea, act * ea, lay.pipe > cluster.devices_per_node)
        out.append(Comm("pipe", "act", "ppermute", lay.pipe, lay.pipe, act, ea, 2 * m, codec))
        # summed by the end stages, one message each way: those the runtime pairs under the
        # policy the plan runs (`jaxhc.parallel.grads.pairs`)
        sizes = {lay.axis(i): k for i, k in enumerate(factors)}
        policy = _policy(lay, cluster, codec_of)
        shared = shape.shared_params()
        paired = sum(shared[k] for k in pairs(tuple(shared), policy, sizes))
        if paired:
            codec = codec_of("pipe", "grad", eg, paired * eg, lay.pipe > cluster.devices_per_node)
            out.append(Comm("pipe", "grad", "psum_pair", lay.pipe, lay.pipe, paired, eg, 1, codec))
    return out


def _fused(lay: Layout, codec, op: str, itemsize: int, feedback: bool = False) -> bool:
    """Whether the MPI transport runs this compressed collective as one fused native call
    (`jaxhc.plan.comm.native`: `MpiTransport.fuses`, the codecs with a `native_call`; with
    error feedback only a float32 reduce-scatter's)."""
    return codec is not None and native(lay.transport, codec, op, itemsize, feedback)


def _members(k: int, stride: int, per_node: int) -> int:
    """Members of a k-rank ring whose members are `stride` devices apart that share a node."""
    return max(1, min(k, per_node // stride)) if per_node % stride == 0 else 1
