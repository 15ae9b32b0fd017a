"""A step's time on one device: its compute, plus the communication its compute does not hide.

Compute, from the model's FLOPs at the cluster's ``compute`` rates (`jaxhc.plan.cluster`):
  forward:   per token of a micro-batch, 2 x (a layer's parameters / tensor) + 4 x seq x width /
             tensor (the attention scores and their weighted sum, the whole seq x seq square, as
             jaxhc's masked attention computes it) per layer of the stage, and 2 x vocab x width /
             tensor for the head; every micro-batch
  backward:  twice the forward; with recomputation the layers' forward once more
  pipeline:  GPipe's bubble: a stage is busy m of the m + p - 1 slots of each pass
  update:    the optimizer-state chunk's values (the padded vector / s_os) x `UPDATE_BYTES`
             (AdamW reads the gradient, the master copy and two moments and writes three back)
             at the memory rate
Only matrix products count as FLOPs (norms, activations and the softmax are memory-bound and
not counted), at one rate: the step's compute is a lower bound where those matter.

Communication: the step's collectives (`jaxhc.plan.cost.collectives`, each timed by
`jaxhc.plan.comm.Comm.seconds`; their sum is the plan's ``comm s``) less what the cluster's
``schedule.overlap`` hides behind compute:
  jaxhc (default, what `jaxhc.parallel.step` does): with ``train.overlap`` (`Layout.overlap`)
        where the step can (the trainer's rule, `jaxhc.parallel.grads.can_overlap`: s_p = 1,
        one micro-batch, error feedback only without ``keep_own``), on the MPI transport, each
        layer's gradient reduce-scatter over the innermost data level is started in the
        backward as soon as the layer's gradients exist where the transport can start it (one
        native call, plain or under a codec the engine fuses, with its error-feedback residual
        too: `jaxhc.plan.comm.native`; the transport's progress threads,
        `jaxhc.collectives.started`) and finished after the backward; so every layer's but
        the last one started hides behind the earlier layers' backward, up to one layer's
        backward each. Nothing else is hidden:
        the shared parameters' reduction, the outer levels and the gathers back run after the
        backward; sharded parameters are gathered when a layer needs them (not prefetched);
        the exchange follows the update; tensor and pipeline traffic sits inside the layers.
        On the XLA transport nothing is hidden (XLA:CPU runs the layers' reductions in program
        order, inside the backward).
  amsp: AMSP's engine: every layer's parameters gathered one layer ahead (prefetched while the
        previous layer computes), forward and backward, and every gradient reduction (its
        reduce-scatter and all-reduce) issued per layer as the backward produces it; the first
        gather of a pass and the last layer's reduction have nothing to hide behind, and the
        shared parameters' part (embedding, head), the exchange after the update, tensor and
        pipeline traffic are not hidden. With several micro-batches a step (gradient
        accumulation) the gathers and the sharded gradients' reduce-scatters recur in every
        micro-batch's passes, and what the step reduces once (a replicated gradient's all-reduce,
        a sharded one's reduction over its replicas) runs in the last micro-batch's backward.
  none: nothing hidden: step = compute + comm s.
A collective of the whole vector that the step runs per layer (jaxhc's overlapped reductions,
AMSP's layer-wise gathers and reductions; ``comm s`` counts it as one call a pass) is timed as
the step runs it: one call per layer of the layer's share (its padded segment over the padded
vector, `jaxhc.plan.layout.device_segments`), each with its own latencies, and one call of the
shared parameters' rest. The link carries one collective at a time, in the order the step
issues them (`pass_time`); hiding does not slow the compute down (on a machine whose cores also
run the codecs and the network stack it does: the prediction is then low).
"""

from __future__ import annotations

import dataclasses

from jaxhc.parallel.grads import can_overlap
from jaxhc.plan.cluster import Cluster, ComputeRate
from jaxhc.plan.comm import Comm, native
from jaxhc.plan.layout import Layout, device_params, device_segments, tokens_per_microbatch
from jaxhc.plan.shapes import ModelShape

__all__ = [
    "UPDATE_BYTES",
    "Compute",
    "StepTime",
    "compute",
    "layer_call",
    "overlapped",
    "pass_time",
    "step_time",
]

UPDATE_BYTES = 28  # per optimizer-state value: gradient, master copy, two moments in; three out


@dataclasses.dataclass(frozen=True)
class Compute:
    """Seconds of a step's compute on one device: per layer and micro-batch, and in all."""

    layer_forward: float  # one layer, one micro-batch
    layer_backward: float  # with recomputation: its forward again
    forward: float  # every micro-batch, head included, pipeline bubble included
    backward: float
    update: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.update


def compute(shape: ModelShape, lay: Layout, batch: int, seq: int, rate: ComputeRate) -> Compute:
    """The step's compute on the busiest device at `rate` (see the module's docstring).

    >>> lay = jaxhc.plan.Layout(data=1, tensor=1, pipe=1, microbatches=1, params=1, grads=1,
    ...                         optim=1, levels=(1,))
    >>> shape = jaxhc.plan.load_shape("gpt2-small")
    >>> c = jaxhc.plan.steptime.compute(shape, lay, 8, 1024, jaxhc.plan.cluster.ComputeRate(
    ...     flops=100e12, memory=1e12))
    >>> round(c.backward / c.forward, 6), round(c.update * 1e12 / 28)   # padded values
    (2.0, 124440576)
    """
    _, tok = tokens_per_microbatch(lay, batch, seq)
    t, m, p = lay.tensor, lay.microbatches, lay.pipe
    layers = shape.layers // p
    per_layer = tok * (2 * shape.layer_params() + 4 * seq * shape.width) / t / rate.flops
    head = tok * 2 * shape.vocab * shape.width / t / rate.flops
    slots = m + p - 1  # GPipe: m micro-batches through p stages
    back = 2 * per_layer + (per_layer if lay.recompute else 0.0)
    _, padded = device_params(shape, lay)
    return Compute(
        per_layer,
        back,
        slots * (layers * per_layer + head),
        slots * (layers * back + 2 * head),
        padded // lay.optim * UPDATE_BYTES / rate.memory,
    )


def pass_time(layers: int, compute: float, gather: float = 0.0, reduce: float = 0.0) -> float:
    """Seconds of one pass over `layers` layers of `compute` seconds each, on a device that
    computes and moves bytes at once, one collective at a time in the order issued: each
    layer's parameters gathered (`gather` seconds) one layer ahead, issued as the previous
    layer starts (the first before the pass: nothing hides it), and its gradients reduced
    (`reduce` seconds) as soon as it ends; the pass ends with its last collective.

    >>> pass_time(4, 1.0, reduce=0.5)      # the last layer's reduction alone is exposed
    4.5
    >>> pass_time(4, 1.0, reduce=2.0)      # the link is the bottleneck: 1 + 4 x 2
    9.0
    >>> pass_time(4, 1.0, gather=0.5)      # the first gather, then prefetched behind compute
    4.5
    """
    free = ready = gather  # the link is busy until `free`; the next layer's parameters `ready`
    now = 0.0
    for i in range(layers):
        start = max(now, ready)
        if gather and i + 1 < layers:
            free = max(free, start) + gather
            ready = free
        now = start + compute
        if reduce:
            free = max(free, now) + reduce
    return max(now, free)


def layer_call(c: Comm, cluster: Cluster, share: float) -> float:
    """Seconds of one layer's call of `c`, a collective of the whole vector that the step runs
    per layer instead: the same collective of the layer's `share` of its message, once (its own
    latencies, bandwidth and codec time)."""
    one = dataclasses.replace(c, message=max(1, round(c.message * share)), count=1)
    return one.seconds(cluster)


def overlapped(
    comms: list[Comm],
    shape: ModelShape,
    lay: Layout,
    cluster: Cluster,
    work: Compute,
    keeps_own: bool = False,
) -> tuple[float, float]:
    """(seconds the step's collectives take as it runs them, seconds of them its compute
    hides) under ``cluster.overlap`` (see the module's docstring); `keeps_own`: the data levels'
    error-feedback reduce-scatters add each rank's own slice uncoded (`jaxhc.plan.cost.
    keeps_own`). A collective of the whole vector that the step runs per layer
    takes its layers' calls (`layer_call`, each with its latencies) and the rest's one call."""
    plain = sum(c.seconds(cluster) for c in comms)
    _, one, layers = device_segments(shape, lay)
    _, padded = device_params(shape, lay)
    share = one / padded  # one layer's part of a whole-vector collective
    rest = 1 - layers * share  # the shared parameters' part

    def split(c: Comm) -> tuple[float, float]:  # (a layer's call, the rest's call)
        return layer_call(c, cluster, share), layer_call(c, cluster, rest) if rest > 0 else 0.0

    if cluster.overlap == "jaxhc":
        can = can_overlap(lay.params > 1, lay.microbatches, keeps_own)
        if lay.transport != "mpi" or not lay.overlap or not can:
            return plain, 0.0
        first = next((c for c in comms if c.role == "reduce"), None)
        if first is None or first.op != "psum_scatter" or not _starts(first, lay):
            return plain, 0.0  # nothing started: no native call (q8:sr; a plain one with EF)
        r, shared = split(first)
        b = work.layer_backward
        exposed = pass_time(layers, b, reduce=r) - layers * b
        return plain - first.seconds(cluster) + layers * r + shared, layers * r - exposed
    if cluster.overlap == "amsp":
        m, total, g, r, once = lay.microbatches, plain, 0.0, 0.0, 0.0
        for c in comms:
            if c.role not in ("gather", "reduce") or (lay.per_layer and c.count >= layers):
                continue  # not a whole-vector collective (jaxhc's per-layer gathers already are)
            one_call, shared = split(c)
            total += c.count * (layers * one_call + shared) - c.seconds(cluster)
            if c.role == "gather":
                g += one_call * c.count / (2 * m)  # per pass, forward and backward
            elif c.count % m == 0:
                r += one_call * c.count / m  # per backward pass
            else:
                once += one_call * c.count  # once a step: in the last micro-batch's backward
        f, b = work.layer_forward, work.layer_backward
        forward = pass_time(layers, f, g) - layers * f
        backward = pass_time(layers, b, g, r) - layers * b
        last = pass_time(layers, b, g, r + once) - layers * b
        exposed = m * forward + (m - 1) * backward + last
        return total, layers * (m * (2 * g + r) + once) - exposed
    return plain, 0.0


def _starts(c: Comm, lay: Layout) -> bool:
    """Whether the step's transport can start `c` and finish it later: one native call."""
    return native(lay.transport, c.codec, c.op, c.itemsize, c.feedback)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """A step's predicted seconds: compute, its collectives as it runs them (`overlapped`), and
    the part of them the compute hides."""

    compute: Compute
    comm: float
    hidden: float

    @property
    def seconds(self) -> float:
        return self.compute.total + self.comm - self.hidden


def step_time(
    shape: ModelShape,
    lay: Layout,
    batch: int,
    seq: int,
    cluster: Cluster,
    comms: list[Comm],
    keeps_own: bool = False,
) -> StepTime | None:
    """The step's time: compute + the communication not hidden; None where the cluster states
    no ``compute`` rates. `keeps_own`: see `overlapped`.

    >>> link = {"gbit_s": 1, "latency_us": 20}
    >>> cluster = jaxhc.plan.cluster.from_dict({
    ...     "name": "two", "nodes": 2, "devices_per_node": 1, "memory_gib": 16,
    ...     "links": {"intra": link, "inter": link}, "compute": {"tflop_s": 0.1,
    ...     "memory_gb_s": 10}})
    >>> lay = jaxhc.plan.Layout(2, 1, 1, 1, 1, 2, 2, (2,), transport="mpi")
    >>> shape = jaxhc.plan.load_shape("gpt2-small")
    >>> comms = jaxhc.plan.collectives(shape, lay, 8, 64, cluster)
    >>> t = jaxhc.plan.steptime.step_time(shape, lay, 8, 64, cluster, comms)
    >>> 0 < t.hidden < t.comm and t.seconds < t.compute.total + t.comm
    True
    """
    if cluster.compute is None:
        return None
    work = compute(shape, lay, batch, seq, cluster.compute)
    return StepTime(work, *overlapped(comms, shape, lay, cluster, work, keeps_own))
