"""Rank the plans of a model on a cluster: predicted communication time under a memory limit.

Candidates (`enumerate_layouts`): every tensor size up to a node's devices and pipe size up to the
layers that divide the devices; the data axis nested at the node boundary (the data ranks of one
node, when there are several and fewer than all) and at the plan's own sizes; every AMSP triple
s_p <= s_g <= s_os (each dividing the next and data, s_g in {s_p, s_os}) of sizes that nest with
the node (divide or are multiples of its data ranks); the flat-axis DDP, ZeRO-1/2/3 for
comparison; micro-batches = pipe (1 without a pipeline or when the batch does not split so),
or with a micro-batch size given, batch / (data x micro-batch) (gradient accumulation);
each codec given for the data levels that cross nodes; with and without recomputation. By
default only the smallest tensor x pipe at which a plan fits is kept (more model parallelism
always moves fewer data-axis bytes, and what it costs, compute efficiency and pipeline bubbles,
is not in the model). A candidate that breaks a rule (tensor not dividing the
heads, ...) is "invalid", one that does not fit the device memory "out of memory"; the rest are
ranked by predicted step time where the cluster states ``compute`` rates (`jaxhc.plan.steptime`:
compute + the communication not hidden), else by communication time (to 3 significant digits),
then without recomputation first, then by memory.
"""

from __future__ import annotations

import dataclasses

from jaxhc.plan.cluster import Cluster
from jaxhc.plan.comm import comm_bytes, comm_time
from jaxhc.plan.cost import (
    Memory,
    codec_by_spec,
    collectives,
    error_feedback,
    keeps_own,
    memory,
)
from jaxhc.plan.layout import Layout, check_layout, trainable
from jaxhc.plan.shapes import ModelShape
from jaxhc.plan.steptime import step_time


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan (`Layout`) with its predicted memory per device, communication per step and step
    time (None without the cluster's ``compute`` rates), why it does not fit (``rejected``,
    empty when it does) and whether `jaxhc train` takes it.

    >>> cluster = jaxhc.plan.cluster.local(devices=8, memory_gib=16)
    >>> best = jaxhc.plan.search(jaxhc.plan.load_shape("gpt2-small"), cluster, batch=8, seq=1024)[0]
    >>> best.rejected, best.trainable, best.layout.data * best.layout.tensor * best.layout.pipe
    ('', 'yes', 8)
    """

    layout: Layout
    memory: Memory | None
    comm_bytes: float
    comm_seconds: float
    rejected: str = ""  # "" when it fits
    trainable: str = ""
    step_seconds: float | None = None  # compute + the communication not hidden

    @property
    def family(self) -> str:
        """DDP, ZeRO-1/2/3 (flat data axis), MiCS (s, s, s) or AMSP (anything else)."""
        lay = self.layout
        d, s = lay.data, lay.sizes
        flat = len(lay.levels) == 1
        named = {(1, 1, 1): "DDP", (1, 1, d): "ZeRO-1", (1, d, d): "ZeRO-2", (d, d, d): "ZeRO-3"}
        if flat and s in named:
            return named[s]
        if s[0] == s[1] == s[2] and 1 < s[0] < d:
            return "MiCS"
        return "AMSP"


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_layouts(
    shape: ModelShape,
    batch: int,
    devices: int,
    per_node: int,
    codecs=("none",),
    precision: str = "float32",
    microbatches: int | None = None,
    tensors=None,
    pipes=None,
    transport: str = "xla",
    nesting: str = "node",
    micro_batch: int | None = None,
):
    for t in tensors or [t for t in divisors(devices) if t <= per_node]:
        if devices % t:
            continue
        for p in pipes or [p for p in divisors(devices // t) if p <= shape.layers]:
            if devices % (t * p):
                continue
            data = devices // (t * p)
            m = microbatches or (p if p > 1 and batch % (data * p) == 0 else 1)
            if micro_batch:  # gradient accumulation: micro-batches of `micro_batch` sequences
                m = max(1, -(-batch // (data * micro_batch)))
            node = per_node // (t * p) if per_node % (t * p) == 0 else 1
            sizes = [s for s in divisors(data) if node % s == 0 or s % node == 0]
            triples = set()
            for s_p in sizes:
                for s_os in sizes:
                    if s_os % s_p:
                        continue
                    for s_g in {s_p, s_os}:
                        triples.add((s_p, s_g, s_os))
            shapes = []
            for tri in sorted(triples):
                own = {node, *tri} if nesting == "node" else set(tri)
                levels = sorted(own - {1, data}) + [data]
                if all(h % lo == 0 for lo, h in zip(levels, levels[1:], strict=False)):
                    shapes.append((tri, tuple(levels)))
            if node > 1 and data > node:  # the flat axis: one ring across the nodes
                for tri in {(1, 1, 1), (1, 1, data), (1, data, data), (data, data, data)}:
                    shapes.append((tri, (data,)))
            for tri, levels in shapes:
                crosses = levels[-1] * t * p > per_node  # a data level crosses nodes
                policy = codecs[0].startswith("policy ")
                # jaxhc's sharded parameters, gathered per layer or whole (`mesh.shard.gather`)
                sharded = tri[0] > 1 and precision == "float32"
                for codec in codecs if crosses or policy else ("none",):
                    for rc in (False, True):
                        for gather in ("layer", "whole") if sharded else ("layer",):
                            yield Layout(
                                data,
                                t,
                                p,
                                m,
                                *tri,
                                levels,
                                codec,
                                precision,
                                rc,
                                gather=gather,
                                transport=transport,
                            )


def evaluate(
    shape: ModelShape, lay: Layout, cluster: Cluster, batch: int, seq: int, codec_of=None
) -> Candidate:
    why = check_layout(shape, lay, batch)
    if why:
        return Candidate(lay, None, 0.0, 0.0, f"invalid: {why}")
    codec_of = codec_of or codec_by_spec(lay.codec)
    try:  # the trainer's rule, under the policy the plan runs
        ef = error_feedback(lay, cluster, codec_of)
    except ValueError as e:  # error feedback the trainer refuses for this plan
        return Candidate(lay, None, 0.0, 0.0, f"invalid: {e}")
    mem = memory(shape, lay, batch, seq, error_feedback=ef, attention=cluster.attention)
    comms = collectives(shape, lay, batch, seq, cluster, codec_of)
    rejected = ""
    if mem.total > cluster.memory:
        rejected = f"out of memory: {mem.total / 2**30:.1f} GiB > {cluster.memory / 2**30:.1f} GiB"
    own = ef and keeps_own(lay, cluster, codec_of)
    step = step_time(shape, lay, batch, seq, cluster, comms, own)
    return Candidate(
        lay,
        mem,
        comm_bytes(comms),
        comm_time(comms, cluster),
        rejected,
        trainable(shape, lay),
        None if step is None else step.seconds,
    )


def rank(rows: list[Candidate]) -> list[Candidate]:
    def key(c):
        # times equal to 3 significant digits (as printed) tie: then no recomputation, less memory
        t = float(f"{c.comm_seconds if c.step_seconds is None else c.step_seconds:.3g}")
        return (
            bool(c.rejected),
            c.rejected.startswith("invalid"),
            t,
            c.layout.recompute,
            c.memory.total if c.memory else 0,
        )

    return sorted(rows, key=key)


def search(
    shape: ModelShape,
    cluster: Cluster,
    batch: int,
    seq: int,
    codecs=("none",),
    precision: str = "float32",
    microbatches: int | None = None,
    tensors=None,
    pipes=None,
    codec_of=None,
    model_parallel: str = "min",
    transport: str = "xla",
    micro_batch: int | None = None,
) -> list[Candidate]:
    """The candidates, ranked (fitting ones first, fastest first). `model_parallel` "min" keeps
    the smallest tensor x pipe at which a plan fits (without ``compute`` rates the model counts
    communication only, so more model parallelism always looks cheaper: it costs compute
    efficiency and pipeline bubbles); "all" keeps every size. `micro_batch` (sequences per
    micro-batch on a data rank) sets each plan's micro-batches, its gradient accumulation:
    batch / (data x micro_batch), rounded up (`microbatches` fixes the count instead).

    >>> cluster = jaxhc.plan.cluster.local(devices=8, memory_gib=16)
    >>> rows = jaxhc.plan.search(jaxhc.plan.load_shape("gpt2-small"), cluster, batch=8, seq=1024,
    ...                          codecs=("none", "zfp:8"))
    >>> rows[0].comm_seconds <= rows[1].comm_seconds and not rows[0].rejected
    True
    """
    for codec in codecs:
        if codec != "none" and not codec.startswith("policy "):
            cluster.speed(codec)  # a codec without a speed is an error now, not per row
    layouts = enumerate_layouts(
        shape,
        batch,
        cluster.devices,
        cluster.devices_per_node,
        codecs,
        precision,
        microbatches,
        tensors,
        pipes,
        transport,
        cluster.nesting,
        micro_batch,
    )
    rows = [evaluate(shape, lay, cluster, batch, seq, codec_of) for lay in layouts]
    if model_parallel not in ("min", "all"):
        raise ValueError(f"--model-parallel {model_parallel!r} must be min or all")
    fits = [c.layout.tensor * c.layout.pipe for c in rows if not c.rejected]
    if model_parallel == "min" and fits:
        rows = [c for c in rows if c.layout.tensor * c.layout.pipe == min(fits)]
    return rank(rows)


def best_of_families(rows: list[Candidate]) -> dict[str, Candidate]:
    """The fastest fitting plan of each family (DDP, ZeRO-1/2/3, MiCS, AMSP), raw data traffic."""
    out: dict[str, Candidate] = {}
    for c in rows:
        if c.rejected or c.layout.codec != "none":
            continue
        out.setdefault(c.family, c)
    return out


def _gib(x: int) -> str:
    return f"{x / 2**30:.1f}"


HEADER = (
    "| # | tensor | pipe | data | s_p | s_g | s_os | groups | codec | recompute | P | G | OS "
    "| act | temp | total GiB | comm GB | comm s | step s | family | trainable |"
)
SEPARATOR = "|" + "---:|" * 7 + "---|---|---|" + "---:|" * 9 + "---|---|"


def row(i, c: Candidate) -> str:
    lay, m = c.layout, c.memory
    groups = list(lay.groups) if len(lay.levels) > 1 else "flat"
    mem = [_gib(x) for x in (m.params, m.grads, m.optim, m.activations, m.temporaries, m.total)]
    return (
        f"| {i} | {lay.tensor} | {lay.pipe} | {lay.data} | {lay.params}{_whole(lay)} | "
        f"{lay.grads} | {lay.optim} | {groups} | {lay.codec} | "
        f"{'yes' if lay.recompute else 'no'} | "
        + " | ".join(mem)
        + f" | {c.comm_bytes / 1e9:.2f} | {c.comm_seconds:.3g} | {_seconds(c.step_seconds)} | "
        + f"{c.family} | {c.trainable} |"
    )


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def describe(lay: Layout, codec: bool = True) -> str:
    groups = list(lay.groups) if len(lay.levels) > 1 else "flat"
    return (
        f"tensor {lay.tensor} pipe {lay.pipe} data {lay.data} (s_p, s_g, s_os) = "
        f"{lay.sizes} groups {groups}"
        + (f" codec {lay.codec}" if codec else "")
        + (" with recomputation" if lay.recompute else "")
        + (", parameters gathered whole" if _whole(lay) else "")
    )


def _whole(lay: Layout) -> str:
    """A mark for jaxhc's sharded parameters gathered whole (`mesh.shard.gather`)."""
    return " whole" if lay.params > 1 and lay.precision == "float32" and not lay.per_layer else ""


def table(rows: list[Candidate], top: int = 10, rejected: int = 10) -> str:
    """The `top` fitting plans as a markdown table, then one line per rejected plan (the first
    `rejected` of them, codec and recomputation variants of one plan folded into its first).

    >>> cluster = jaxhc.plan.cluster.local(devices=8, memory_gib=16)
    >>> rows = jaxhc.plan.search(jaxhc.plan.load_shape("gpt2-small"), cluster, batch=8, seq=1024)
    >>> print(jaxhc.plan.table(rows, top=1, rejected=0).splitlines()[0][:40])
    | # | tensor | pipe | data | s_p | s_g |
    """
    fits = [c for c in rows if not c.rejected]
    lines = [HEADER, SEPARATOR]
    lines += [row(i + 1, c) for i, c in enumerate(fits[:top])]
    if not fits:
        lines.append("(no plan fits)")

    def key(c):
        lay = c.layout
        return (lay.data, lay.tensor, lay.pipe, lay.sizes, lay.levels)

    fitting = {key(c) for c in fits}
    least: dict = {}  # a plan's variant that needs the least memory
    for c in rows:
        k = key(c)
        if c.rejected and k not in fitting:
            best = least.get(k)
            if best is None or (c.memory and best.memory and c.memory.total < best.memory.total):
                least[k] = c
    out = [f"rejected: {describe(c.layout, codec=False)}: {c.rejected}" for c in least.values()]
    lines.append(f"{len(fits)} plans fit; {len(out)} rejected")
    lines += out[:rejected]
    if len(out) > rejected:
        lines.append(f"... and {len(out) - rejected} more rejected (--rejected N shows more)")
    return "\n".join(lines)
