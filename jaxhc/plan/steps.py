"""The rule of a train step's data-axis collectives, written once: which level of the nested
data axis reduce-scatters, all-gathers, all-reduces or broadcasts what, how often, in which
part of the step (`data_steps`). Both descriptions of a step's traffic are built from it: the
ledger's exact bytes (`jaxhc.plan.traffic.data_collectives`) and the planner's priced
collectives (`jaxhc.plan.cost.collectives`), which add the axis names, codecs and links.

Sizes are in whatever unit the caller gives the vector in (bytes or values): a message is that
unit's count one device passes in; the order is the step's.
"""

from __future__ import annotations

import dataclasses

__all__ = ["DataStep", "data_steps"]


@dataclasses.dataclass(frozen=True)
class DataStep:
    """One data-axis collective of a step on one device, by level (0 innermost).

    >>> jaxhc.plan.data_steps((4,), (1, 4, 4), 4096)[0]  # doctest: +NORMALIZE_WHITESPACE
    DataStep(level=0, kind='grad', op='psum_scatter', ranks=4, group=4, inner=1, message=4096,
             count=1, role='reduce')
    """

    level: int  # its data level (its axis), 0 innermost
    kind: str  # "grad" or "param"
    op: str  # "psum_scatter", "all_gather", "psum" or "broadcast"
    ranks: int  # its participants
    group: int  # the data ranks of the group it closes (the level's size times the inner ones)
    inner: int  # the data ranks between neighbouring members (the inner levels' ranks)
    message: int  # what this device passes in (the caller's unit)
    count: int  # calls per step
    role: str  # "gather" (parameters before use), "reduce" (gradients), "exchange" (update)


def data_steps(
    factors: tuple[int, ...],
    sizes: tuple[int, int, int],
    whole: int,
    segments: tuple[int, int, int] | None = None,
    *,
    microbatches: int = 1,
    layerwise: bool = False,
    all_reduce: bool = False,
    broadcast: bool = False,
    kept: bool = False,
) -> list[DataStep]:
    """The data-axis collectives of one step: `factors` the levels' sizes (innermost first),
    `sizes` (s_p, s_g, s_os), `whole` the device's padded flat vector; `segments` (shared
    segment, a layer's, local layers) when sharded parameters are gathered per layer (jaxhc's
    float32 step); `layerwise` a mixed-precision step (ZeRO-3 style: gathers forward and
    backward every micro-batch, a sharded gradient reduce-scattered every micro-batch inside its
    group); `all_reduce` AMSP's gradient schedule (``schedule.gradients``), `broadcast` its
    parameter exchange (``schedule.exchange``); `kept` the layers' gathers in the forward only,
    kept for the backward (``mesh.shard.gather: keep``). Levels of one rank move nothing and are
    left out.

    >>> [(s.level, s.op, s.message, s.role) for s in jaxhc.plan.data_steps((2, 4), (2, 2, 8), 4096)]
    ... # s_p = s_g = 2 on the inner level, the optimizer state over all 8
    [(0, 'all_gather', 2048, 'gather'), (0, 'psum_scatter', 4096, 'reduce'),
     (1, 'psum_scatter', 2048, 'reduce'), (1, 'all_gather', 512, 'reduce'),
     (1, 'all_gather', 512, 'exchange')]
    """
    s_p, s_g, s_os = sizes
    levels, n = [], 1
    for k in factors:
        n *= k
        levels.append(n)
    data, m = levels[-1], microbatches
    out: list[DataStep] = []

    def add(i, kind, op, message, count, role, ranks=None, inner=None):
        k = factors[i] if ranks is None else ranks
        if k > 1:
            inner = (levels[i - 1] if i else 1) if inner is None else inner
            out.append(DataStep(i, kind, op, k, levels[i], inner, message, count, role))

    inside = [i for i, g in enumerate(levels) if g <= s_p]
    # parameter gathers (s_p > 1), outermost level first: the whole vector once (the forward;
    # every micro-batch, forward and backward, when layerwise) or per layer (the shared segment
    # once, each layer's forward and backward, every micro-batch)
    if segments is not None:
        shared, one, layers = segments
        passes = 1 if kept else 2  # forward (and backward, unless kept)
        gathers = [(shared, 1), (one, passes * m * layers)]
        scatters = [(shared, 1), (one, layers)]
    else:
        gathers, scatters = [(whole, 2 * m if layerwise else 1)], []
    for part, count in gathers if s_p > 1 else ():
        n = part // s_p
        for i in reversed(inside):
            add(i, "param", "all_gather", n, count, "gather")
            n *= factors[i]
    # gradient reduce-scatter, innermost first, to 1/data, once a step (layerwise: every
    # micro-batch inside a sharded gradient's group, which keeps only its chunk of the sum; per
    # layer inside s_p, after the micro-batches' sum, for per-layer gathers)
    for part, count in scatters:
        n = part
        for i in inside:
            add(i, "grad", "psum_scatter", n, count, "reduce")
            n //= factors[i]
    n = whole
    # AMSP: a sharded gradient reduce-scattered down to the OS chunk, a replicated one (s_g = 1)
    # not at all; then one all-reduce over the chunk's replicas
    reduced = (s_os if s_g > 1 else 1) if all_reduce else data
    per_micro = layerwise and s_g > 1
    for i, g in enumerate(levels):
        if g > reduced:
            continue
        if not (scatters and g <= s_p):
            add(i, "grad", "psum_scatter", n, m if per_micro and g <= s_g else 1, "reduce")
        n //= factors[i]
    if all_reduce and reduced < data:  # one group of data / reduced ranks, reduced apart
        add(len(levels) - 1, "grad", "psum", n, 1, "reduce", data // reduced, reduced)
    for i in reversed(range(len(levels))) if not all_reduce else ():
        if levels[i] > s_g:  # back over the levels outside the gradient group
            add(i, "grad", "all_gather", n, 1, "reduce")
            n *= factors[i]
    # the updated OS chunk over the levels inside s_os and outside s_p, outermost first:
    # all-gathered, or broadcast by each member of a level (k broadcasts of the chunk)
    n = whole // s_os
    for i in reversed(range(len(levels))):
        if s_p < levels[i] <= s_os:
            op, count = ("broadcast", factors[i]) if broadcast else ("all_gather", 1)
            add(i, "param", op, n, count, "exchange")
            n *= factors[i]
    return out
