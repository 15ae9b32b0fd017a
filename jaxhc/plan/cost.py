"""Memory per device and communication time per step of one plan (a `Layout`) on a `Cluster`.

A plan: data x tensor x pipe devices (the mesh is data-major, pipe innermost, so a data rank's
tensor x pipe devices sit next to each other), the AMSP sizes s_p <= s_g <= s_os over the data
axis nested in `levels` (group sizes, innermost first, ending with data), the codec of the data
levels that cross nodes, the precision and whether layers are recomputed.

Memory (bytes per device; psi = the device's parameters, its tensor x pipe block):
  float32 (jaxhc): P = 4 psi (s_p = 1: the parameter tree) or 4 psi_pad / s_p (its chunk of the
                   padded flat vector: its segments, the shared parameters and each layer, in
                   data pieces of whole codec blocks; estimated: 4 x data), G = 4 psi_pad / s_g
                   (the reduced chunk, a
                   temporary), OS = 12 psi_pad / s_os (two AdamW moments and the master copy) + 8,
                   with error feedback + 4 x the residual of every reduce-scatter level (the
                   vector it sends: psi_pad innermost, 1/(the inner levels' ranks) of it further
                   out); psi, for a model jaxhc trains, its flat layout's count
                   (`jaxhc.plan.memory.state_bytes`, equal to the compiled step's to the byte)
  mixed (AMSP):    P = 2 psi / s_p, G = 2 psi / s_g, OS = 12 psi / s_os
  activations:     per layer and micro-batch `ModelShape.activation_bytes` (+ the softmax
                   probabilities without recomputation), for layers / pipe layers and every
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
                            with s_p > 1: every micro-batch, no whole gradient is kept); then the
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
In float32 these are exactly `jaxhc.plan.traffic.data_collectives` (tested), whose bytes equal
the ledger's. A cluster's ``schedule`` (`jaxhc.plan.cluster`) may run them as AMSP does instead:
``gradients: all_reduce``: a replicated gradient (s_g = 1) all-reduced whole over the data axis
(one psum of data ranks), a sharded one reduce-scattered over the levels inside s_os and then
all-reduced over the chunk's data / s_os replicas (one psum, its ranks s_os apart), no gathers
back; ``exchange: broadcast``: per level of the exchange, each of its k members broadcasts its
chunk (k broadcasts of the chunk, uncompressed).

Time of a collective of k ranks: (k - 1) latencies (2 (k - 1) for an all-reduce) + wire bytes /
bandwidth of the links its group spans (intra-node when its devices fit in a node; across nodes
min(intra, m x inter) for a ring with m members in each node: a ring step crosses each node
boundary once, and a node's rings share its devices' NIC shares) + its codec's
encode and decode time (a reduce-scatter encodes its n raw bytes and decodes n; an all-gather
encodes its chunk and decodes k chunks) at the cluster's speeds; a codec that may fall back adds
the flag's agreement, an all-reduce of 4 bytes a rank (2 (k - 1) latencies). Under a codec the
payloads move as jaxhc's XLA transport moves them (`Comm.legs`: a reduce-scatter's by an
all-to-all); a cluster's ``links.collectives`` gives an op over a group inside a node its own
latency and bandwidth for that group size (measured by `jaxhc profile --links`), and
``links.inter_collectives`` an op across nodes its latency and per-NIC-share bandwidth by the
nodes its group spans (in place of ``links.inter``: `Cluster.inter_link`). On the MPI
transport (``Layout.transport``) a ZFP or MPC psum, reduce-scatter or all-gather without error
feedback is one fused native call (`jaxhc.transport._mpi_fused`): its segments of
SEGMENT_BYTES raw bytes are encoded, sent and decoded in a pipeline, so its wire time W and codec
time C give max(W, C) + min(W, C) / S for S segments of a rank's chunk (a two-stage pipeline of
equal segments), and its flags travel in the messages (only the reduce-scatter, whose ranks see
only their own pieces, agrees in an extra all-reduce). Collectives run one after the other and
nothing overlaps with compute: a step's communication time is their sum.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxhc.codecs import Codec, parse
from jaxhc.collectives import volume
from jaxhc.plan.cluster import Cluster, Link
from jaxhc.plan.shapes import ModelShape
from jaxhc.transport._mpi_fused import SEGMENT_BYTES

FUSED_OPS = ("psum", "psum_scatter", "all_gather")  # the MPI transport's fused native calls

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
    gather: str = "layer"  # float32, s_p > 1: ``mesh.shard.gather`` (per layer or whole)
    transport: str = "xla"  # how the collectives run: "xla" or "mpi" (`--transport`)

    @property
    def per_layer(self) -> bool:
        """Whether jaxhc's step (float32) gathers sharded parameters layer by layer."""
        return self.params > 1 and self.precision == "float32" and self.gather == "layer"

    @property
    def sizes(self) -> tuple[int, int, int]:
        return (self.params, self.grads, self.optim)

    @property
    def factors(self) -> tuple[int, ...]:
        """The levels' own sizes, innermost first."""
        return tuple(h // lo for lo, h in zip((1, *self.levels), self.levels, strict=False))

    def axis(self, i: int) -> str:
        """jaxhc's name of level i (0 innermost): "data" alone, else data.0 outermost."""
        k = len(self.levels)
        return "data" if k == 1 else f"data.{k - 1 - i}"

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


@dataclasses.dataclass(frozen=True)
class Comm:
    """One collective of a step on one device."""

    axis: str  # "data", "data.<i>", "tensor", "pipe"
    kind: str  # "param", "grad", "act" (tensor and pipe)
    op: str  # "all_gather", "psum_scatter", "psum", "ppermute", "psum_pair"
    ranks: int
    span: int  # consecutive devices its group covers (for the link level)
    message: int  # values this device passes in
    itemsize: int
    count: int  # times per step
    codec: Codec | None = None
    per_node: int = 1  # its ring's members in one node (consecutive), when it crosses nodes
    fused: bool = False  # the MPI transport's fused native call (codec and wire pipelined)

    @property
    def raw(self) -> float:
        """Raw bytes per call (ring)."""
        n = self.message * self.itemsize
        k = self.ranks
        return {
            "all_gather": (k - 1) * n,
            "psum_scatter": (k - 1) / k * n,
            "psum": 2 * (k - 1) / k * n,
            "ppermute": (k - 1) / k * n,  # a pipeline: the last stage sends nothing forward
            "psum_pair": 2 / k * n,  # two of the k ranks send
            "broadcast": n,  # a pipelined ring: every link carries the whole message
        }[self.op]

    @property
    def wire(self) -> float:
        """Bytes per call as jaxhc's compressed algorithms move them (raw without a codec)."""
        return wire_bytes(self.codec, self.op, self.ranks, self.message, self.itemsize, self.raw)

    def bandwidth(self, cluster: Cluster) -> float:
        """Bytes/s per device: intra-node when the group fits a node; across nodes, a node's
        rings of this level (per_node / m of them, m = its members in the node) share the node's
        per_node NIC shares, and each ring step crosses once per node: min(intra, m x inter)."""
        return self.link(cluster, self.op).bandwidth

    def link(self, cluster: Cluster, op: str) -> Link:
        """The latency per step and bandwidth per device `op` gets over this group: the level's
        links inside a node; across nodes min(intra, m x inter) at `Cluster.inter_link`'s
        figures for `op` and the nodes the group spans (``links.inter``'s without a table)."""
        if self.span <= cluster.devices_per_node:
            return cluster.intra
        inter = cluster.inter_link(op, -(-self.ranks // self.per_node))  # the nodes it spans
        return Link(min(cluster.intra.bandwidth, self.per_node * inter.bandwidth), inter.latency)

    def legs(self) -> list[tuple[str, int, float]]:
        """(op, latency steps, bytes) of what moves one call: the op itself, or under a codec
        its payloads (a reduce-scatter's by an all-to-all, an all-reduce's by an all-to-all
        and an all-gather, half each) and, when the codec may fall back, the agreement on the
        flag (an all-reduce of an int32 per rank, `jaxhc.collectives._common.guarded`)."""
        k = self.ranks
        steps = {"psum": 2 * (k - 1), "ppermute": 1, "psum_pair": 1}.get(self.op, k - 1)
        if self.codec is None or self.codec.spec == "none":
            return [(self.op, steps, self.raw)]
        agree = volume.agreement(self.codec, k)
        payload = self.wire - agree
        if self.fused:  # the call's own schedule; flags in its messages but a scatter's
            agreed = self.op == "psum_scatter" and agree
            return [(self.op, steps, payload)] + ([("psum", 2 * (k - 1), agree)] if agreed else [])
        if self.op == "psum_scatter":
            out = [("all_to_all", k - 1, payload)]
        elif self.op == "psum":
            out = [("all_to_all", k - 1, payload / 2), ("all_gather", k - 1, payload / 2)]
        else:
            out = [(self.op, steps, payload)]
        return out + [("psum", 2 * (k - 1), agree)] if agree else out

    def seconds(self, cluster: Cluster) -> float:
        latency = wire = codec = 0.0
        for op, steps, nbytes in self.legs():
            own = cluster.collective_link(op, self.ranks, self.span)
            if own is not None:  # links.collectives: this op's figures for its group size
                latency += steps * own.latency
                wire += nbytes / own.bandwidth
            else:
                link = self.link(cluster, op)
                latency += steps * link.latency
                wire += nbytes / link.bandwidth
        n = self.message * self.itemsize
        if self.codec is not None and self.codec.spec != "none":
            speed = cluster.speed(self.codec.spec)
            encoded = n + n / self.ranks if self.op == "psum" else n
            decoded = {"all_gather": self.ranks * n, "psum": 2 * n, "psum_pair": 2 * n}.get(
                self.op, n
            )
            codec = encoded / speed.encode + decoded / speed.decode
        if self.fused:  # S segments of a rank's chunk in a two-stage pipeline
            chunk = n if self.op == "all_gather" else n / self.ranks
            segments = max(1, math.ceil(chunk / SEGMENT_BYTES))
            return self.count * (latency + max(wire, codec) + min(wire, codec) / segments)
        return self.count * (latency + wire + codec)


def _dtype(itemsize: int):
    return jnp.float32 if itemsize == 4 else jnp.bfloat16


def wire_bytes(codec, op: str, ranks: int, message: int, itemsize: int, raw: float) -> float:
    """What jaxhc's algorithms move for one call under `codec` (None: `raw`): the codec's static
    payload per row (rows padded to `ROW_MULTIPLE`) and the fallback agreement flags."""
    if codec is None or codec.spec == "none":
        return raw
    return volume.compressed(codec, op, ranks, message, _dtype(itemsize))


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


@functools.lru_cache(maxsize=256)
def _flat_layout(gpt, data: int, tensor: int, pipe: int):
    from jaxhc.model.config import MeshConfig
    from jaxhc.parallel.layout import FlatLayout

    return FlatLayout(_param_shapes(gpt), MeshConfig(data=data, tensor=tensor, pipe=pipe))


@functools.lru_cache(maxsize=16)
def _param_shapes(gpt):
    from jaxhc.model import gpt as gpt_model

    return jax.eval_shape(functools.partial(gpt_model.init_params, gpt), 0)


def device_params(shape: ModelShape, lay: Layout) -> tuple[int, int]:
    """(parameters on the device, its padded flat vector): exact (jaxhc's layout) for a model
    jaxhc trains in float32, else `ModelShape.device_params` padded to 4 x data."""
    if shape.gpt is not None and lay.precision == "float32":
        fl = _flat_layout(shape.gpt, lay.data, lay.tensor, lay.pipe)
        return fl.size, fl.padded
    size = shape.device_params(lay.tensor, lay.pipe)
    q = 4 * lay.data
    return size, -(-size // q) * q


def device_segments(shape: ModelShape, lay: Layout) -> tuple[int, int, int]:
    """(shared segment, one layer's segment, local layers) of the device's flat vector, padded
    values (`jaxhc.parallel.layout.FlatLayout`): exact for a model jaxhc trains in float32."""
    from jaxhc.parallel.layout import ALIGN

    layers = shape.layers // lay.pipe
    q = ALIGN * lay.data
    if shape.gpt is not None and lay.precision == "float32":
        fl = _flat_layout(shape.gpt, lay.data, lay.tensor, lay.pipe)
        return fl.shared_padded, fl.layer_padded, fl.layers
    _, padded = device_params(shape, lay)
    per_device = -(-shape.layer_params() // lay.tensor)
    layer = -(-per_device // q) * q
    return max(padded - layers * layer, 0), layer, layers


def tokens_per_microbatch(lay: Layout, batch: int, seq: int) -> tuple[int, int]:
    """(sequences, tokens) of one micro-batch on one data rank."""
    b = batch // (lay.data * lay.microbatches)
    return b, b * seq


def residual_values(lay: Layout, padded: int) -> int:
    """Error feedback: a residual per reduce-scatter level (a level of k > 1 ranks), the vector it
    sends: `padded` values at the innermost, 1/(the inner levels' ranks) of it further out."""
    total, n = 0, padded
    for k in lay.factors:
        if k > 1:
            total += n
            n //= k
    return total


def memory(
    shape: ModelShape, lay: Layout, batch: int, seq: int, error_feedback: bool = False
) -> Memory:
    """Per device; `error_feedback`: the data levels' grad codec keeps residuals (float32: OS)."""
    ep, eg, ea = PRECISIONS[lay.precision]
    size, padded = device_params(shape, lay)
    if lay.precision == "float32":
        p = 4 * (size if lay.params == 1 else padded // lay.params)
        g = 4 * padded // lay.grads
        os_ = 4 * (3 * padded // lay.optim + 2)
        if error_feedback:
            os_ += 4 * residual_values(lay, padded)
    else:
        p, g, os_ = 2 * padded // lay.params, 2 * padded // lay.grads, 12 * padded // lay.optim
    b, tok = tokens_per_microbatch(lay, batch, seq)
    t, layers = lay.tensor, shape.layers // lay.pipe
    full = shape.activation_bytes(tok, t, ea, False) + shape.attention_bytes(b, seq, t, ea)
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
    return Memory(p, g, os_, act, temp)


def codec_by_spec(spec: str):
    """The planner's choice: `spec` on the data levels that cross nodes, nothing elsewhere."""
    codec = parse(spec)
    if codec is not None and codec.spec == "none":
        codec = None

    def of(axis, kind, itemsize, nbytes, inter):
        return codec if inter and kind in ("grad", "param") else None

    return of


def codec_by_policy(policy):
    """A jaxhc policy's choice per axis and kind (``min_bytes`` and dtype rules as the
    collectives apply them)."""
    from jaxhc.policy import Policy

    pol = Policy.load(policy)

    def of(axis, kind, itemsize, nbytes, inter):
        codec = pol.codec_for(axis, kind, _dtype(itemsize))
        if codec is None or not codec.supports(_dtype(itemsize)) or nbytes < pol.min_bytes:
            return None
        return codec

    of.error_feedback = pol.error_feedback("data")  # the trainer's rule: residuals in the state
    return of


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
    feedback = getattr(codec_of, "error_feedback", False)
    ep, eg, ea = PRECISIONS[lay.precision]
    _, padded = device_params(shape, lay)
    tp = lay.tensor * lay.pipe
    m = lay.microbatches
    factors, levels = lay.factors, lay.levels
    out: list[Comm] = []

    def add(i, kind, op, message, itemsize, count):
        k = factors[i]
        if k == 1:
            return
        span = levels[i] * tp
        inter = span > cluster.devices_per_node
        codec = codec_of(lay.axis(i), kind, itemsize, message * itemsize, inter)
        codec = None if op == "broadcast" else codec  # jaxhc has no compressed broadcast
        members = _members(k, (levels[i - 1] if i else 1) * tp, cluster.devices_per_node)
        fused = _fused(lay, codec, op, feedback and kind == "grad")
        out.append(
            Comm(lay.axis(i), kind, op, k, span, message, itemsize, count, codec, members, fused)
        )

    inside = lambda s: [i for i, g in enumerate(levels) if g <= s]  # noqa: E731
    # parameter gathers (s_p > 1), outermost level first: jaxhc's step (float32) the whole vector
    # once (forward) or per layer (the shared segment once, each layer's forward and backward,
    # every micro-batch); layer by layer, forward and backward, every micro-batch in mixed
    layerwise = lay.precision != "float32"
    if lay.per_layer:
        shared, one, layers = device_segments(shape, lay)
        gathers, scatters = [(shared, 1), (one, 2 * m * layers)], [(shared, 1), (one, layers)]
    else:
        gathers, scatters = [(padded, 2 * m if layerwise else 1)], []
    for whole, count in gathers if lay.params > 1 else ():
        n = whole // lay.params
        for i in reversed(inside(lay.params)):
            add(i, "param", "all_gather", n, ep, count)
            n *= factors[i]
    # gradient reduce-scatter, innermost first, to 1/data (once a step; per micro-batch inside
    # s_g for a layer-wise s_p > 1, which keeps no whole gradient; per layer inside s_p for
    # jaxhc's per-layer gathers, after the micro-batches' sum)
    per_micro = layerwise and lay.params > 1
    for whole, count in scatters:
        n = whole
        for i in inside(lay.params):
            add(i, "grad", "psum_scatter", n, eg, count)
            n //= factors[i]
    n = padded
    # AMSP's schedule: a sharded gradient reduce-scattered down to the OS chunk, a replicated
    # one (s_g = 1) not at all; then one all-reduce over the chunk's replicas
    amsp = cluster.gradients == "all_reduce"
    reduced = (lay.optim if lay.grads > 1 else 1) if amsp else lay.data
    for i in inside(reduced):
        count = m if per_micro and levels[i] <= lay.grads else 1
        if not (scatters and levels[i] <= lay.params):
            add(i, "grad", "psum_scatter", n, eg, count)
        n //= factors[i]
    if amsp and reduced < lay.data:  # the replicas: one group of data / reduced ranks
        k, span, axis = lay.data // reduced, lay.data * tp, lay.axis(len(levels) - 1)
        codec = codec_of(axis, "grad", eg, n * eg, span > cluster.devices_per_node)
        members = _members(k, reduced * tp, cluster.devices_per_node)
        fused = _fused(lay, codec, "psum", feedback)
        out.append(Comm(axis, "grad", "psum", k, span, n, eg, 1, codec, members, fused))
    for i in reversed(range(len(levels))) if not amsp else ():  # back outside the gradient group
        if levels[i] > lay.grads:
            add(i, "grad", "all_gather", n, eg, 1)
            n *= factors[i]
    # parameter exchange after the update: the OS chunk over the levels inside s_os, outside
    # s_p, all-gathered, or broadcast by each member of a level (k uncompressed broadcasts)
    n = padded // lay.optim
    broadcast = cluster.exchange == "broadcast"
    for i in reversed(inside(lay.optim)):
        if levels[i] > lay.params:
            if broadcast:  # one broadcast of its chunk by each member
                add(i, "param", "broadcast", n, ep, factors[i])
            else:
                add(i, "param", "all_gather", n, ep, 1)
            n *= factors[i]
    b, tok = tokens_per_microbatch(lay, batch, seq)
    act = tok * shape.width
    if lay.tensor > 1:
        codec = codec_of("tensor", "act", ea, act * ea, tp > cluster.devices_per_node)
        count = 4 * m * shape.layers // lay.pipe
        members = _members(lay.tensor, lay.pipe, cluster.devices_per_node)
        fused = _fused(lay, codec, "psum", False)
        out.append(
            Comm("tensor", "act", "psum", lay.tensor, tp, act, ea, count, codec, members, fused)
        )
    if lay.pipe > 1:
        codec = codec_of("pipe", "act", ea, act * ea, lay.pipe > cluster.devices_per_node)
        out.append(Comm("pipe", "act", "ppermute", lay.pipe, lay.pipe, act, ea, 2 * m, codec))
        # summed by the end stages, one message each way; the positions too under a lossy data
        # grad codec (`jaxhc.parallel.step._paired`)
        lossy = any(c.kind == "grad" and c.codec and not c.codec.lossless for c in out)
        paired = shape.paired_params(positions=lossy)
        if paired:
            codec = codec_of("pipe", "grad", eg, paired * eg, lay.pipe > cluster.devices_per_node)
            out.append(Comm("pipe", "grad", "psum_pair", lay.pipe, lay.pipe, paired, eg, 1, codec))
    return out


def _fused(lay: Layout, codec, op: str, feedback: bool) -> bool:
    """Whether the MPI transport runs this compressed collective as one fused native call (the
    codecs with a `native_call`: ZFP and MPC; error feedback takes jaxhc's own algorithm, which
    needs the decoded payloads)."""
    native = codec is not None and codec.native_call(jnp.float32) is not None
    return lay.transport == "mpi" and native and op in FUSED_OPS and not feedback


def _members(k: int, stride: int, per_node: int) -> int:
    """Members of a k-rank ring whose members are `stride` devices apart that share a node."""
    return max(1, min(k, per_node // stride)) if per_node % stride == 0 else 1


def comm_time(comms: list[Comm], cluster: Cluster) -> float:
    return sum(c.seconds(cluster) for c in comms)


def comm_bytes(comms: list[Comm]) -> float:
    return sum(c.count * c.wire for c in comms)


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
