"""A cluster file: its keys, and a `jaxhc.plan.cluster.Cluster` from them (`from_dict`, `load`),
or this machine as one node (`local`).

```yaml
name: a100-1024
nodes: 128
devices_per_node: 8
memory_gib: 80                  # per device
links:                          # per device, when every device of a node sends at once
  intra: {gbit_s: 2400, latency_us: 3}
  inter: {gbit_s: 200, latency_us: 10}
codecs:                         # per device: GB/s (1e9 bytes/s) of the raw values in and out
  zfp:8: {encode_gb_s: 100, decode_gb_s: 100}
source: assumed / measured by `jaxhc profile` ...   # free text, kept
```
A single-node cluster may omit ``links.inter``. `jaxhc profile` writes such a file for this
machine. Bad input is one line naming the key.

Optionally ``links.collectives`` gives one node's collectives their own figures, per op
(`COLLECTIVE_OPS`) and group size (ranks, at most ``devices_per_node``), where one latency and
bandwidth describe them badly (`jaxhc profile --links` measures them: XLA:CPU's in-process
collectives, where a group of 2 among 8 devices moves a byte slower than the group of 8)::

    links:
      intra: {gbit_s: 19.5, latency_us: 20}
      collectives:
        all_gather: {2: {gbit_s: 11, latency_us: 0}, 8: {gbit_s: 25, latency_us: 18}}

A collective whose group fits a node takes its op's figures for its group size when given
(`Cluster.collective_link`), else ``links.intra``. Both tables also take ``broadcast`` (the
optimizer-state exchange of ``schedule.exchange: broadcast``, below).

Optionally ``links.inter_collectives`` does the same for groups that cross nodes: per op and
group size (the number of nodes the group spans, >= 2: a ring of k ranks with m members in
each node spans k / m), the bandwidth per device's NIC share and the latency per ring step such
a collective gets, where a group over many nodes gets much less of the link than one over a few
(more ring steps, smaller pieces per step, more traffic through the fabric's upper levels)::

    links:
      inter: {gbit_s: 200, latency_us: 10}
      inter_collectives:
        psum: {2: {gbit_s: 190, latency_us: 8}, 128: {gbit_s: 90, latency_us: 20}}

Its figures replace ``links.inter`` in the ring's bandwidth min(intra, m x inter) (m: the
ring's members in one node) and in its latency (`Cluster.inter_link`). A group size between two
listed ones takes figures interpolated linearly in log(group size) (log-log for the bandwidth,
log-linear for the latency); one below the smallest or above the largest listed size takes that
end's figures; an op not listed takes ``links.inter``. The message size enters through each
entry's latency and bandwidth (an alpha-beta pair per op and size).

Optionally ``schedule`` says how the training system runs a plan's data-axis collectives
(default: as jaxhc's step runs them; `jaxhc.plan.cost.collectives`)::

    schedule:
      gradients: scatter      # scatter (jaxhc): reduce-scatter over every level to 1/data, then
                              # all-gather back over the levels outside s_g; all_reduce (AMSP):
                              # a replicated gradient (s_g = 1) all-reduced whole over the data
                              # axis in one collective; a sharded one reduce-scattered over the
                              # levels inside s_os, then all-reduced in ONE collective over the
                              # chunk's replicas (the levels outside s_os as one group)
      exchange: all_gather    # the updated parameters over the levels inside s_os, outside
                              # s_p: all_gather (jaxhc) or broadcast (AMSP: each member of a
                              # level broadcasts its updated chunk to the others in turn)
      nesting: node           # node (jaxhc's search): the data axis nested at the node boundary
                              # and at the plan's sizes; sizes (AMSP's groups): at its sizes only
      overlap: jaxhc          # what the step hides behind its compute (`jaxhc.plan.steptime`):
                              # jaxhc (its step: on the MPI transport, the layers' first-level
                              # gradient reduce-scatters behind the earlier layers' backward);
                              # amsp (parameter gathers prefetched a layer ahead, every gradient
                              # reduction issued per layer in the backward); none
      latency: inter          # a ring across nodes: inter (every step at the inter-node
                              # link's latency) or crossing (NCCL's ring model: only the steps
                              # that cross a node boundary, nodes - 1 of a ring's k - 1, at the
                              # inter-node latency; the others at links.intra's)
      attention: materialized # materialized (jaxhc: each layer keeps its softmax
                              # probabilities, heads x seq^2 per sequence, for the backward) or
                              # fused (a fused attention kernel keeps none: `jaxhc.plan.cost`)

Optionally ``compute`` gives a device's rates, from which the planner predicts a step's time
(`jaxhc.plan.steptime`: forward, backward and update, plus the communication not hidden)::

    compute:
      tflop_s: 150            # matrix products at the plans' precision, per device
      memory_gb_s: 1500       # the optimizer update's bytes (read and written), per device

Without it the planner predicts communication only. `jaxhc profile` measures both here.

A broadcast is uncompressed; one of a chunk of c bytes over k ranks is a pipelined ring: k - 1
steps of latency, c bytes over every link (`jaxhc.plan.comm.Comm`). The schedule is what a
plan's prediction assumes, not what `jaxhc train` runs (jaxhc's step is the default's).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxhc.codecs import parse
from jaxhc.plan.cluster import (
    SCHEDULE,
    TABLE_OPS,
    Cluster,
    CodecSpeed,
    ComputeRate,
    Link,
)
from jaxhc.schema import Invalid, structure

# --- the cluster file's keys (`jaxhc.schema.structure`) -----------------------------------------


def _positive(key: str, value, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        raise Invalid(key, value, "> 0" if strict else ">= 0")


@dataclasses.dataclass(frozen=True)
class LinkKeys:
    """A link's figures as a cluster file gives them."""

    gbit_s: float
    latency_us: float

    def __post_init__(self):
        _positive("gbit_s", self.gbit_s)
        _positive("latency_us", self.latency_us, strict=False)

    def link(self) -> Link:
        return Link(self.gbit_s * 1e9 / 8, self.latency_us * 1e-6)


@dataclasses.dataclass(frozen=True)
class SpeedKeys:
    """A codec's speeds as a cluster file gives them."""

    encode_gb_s: float
    decode_gb_s: float

    def __post_init__(self):
        _positive("encode_gb_s", self.encode_gb_s)
        _positive("decode_gb_s", self.decode_gb_s)


@dataclasses.dataclass(frozen=True)
class TableKeys:
    """A link table: per op (`TABLE_OPS`), group size -> figures."""

    all_gather: dict[Any, LinkKeys] | None = None
    psum_scatter: dict[Any, LinkKeys] | None = None
    all_to_all: dict[Any, LinkKeys] | None = None
    psum: dict[Any, LinkKeys] | None = None
    broadcast: dict[Any, LinkKeys] | None = None


@dataclasses.dataclass(frozen=True)
class LinksKeys:
    intra: LinkKeys
    inter: LinkKeys | None = None
    collectives: TableKeys | None = None
    inter_collectives: TableKeys | None = None


@dataclasses.dataclass(frozen=True)
class ScheduleKeys:
    gradients: str = SCHEDULE["gradients"][0]
    exchange: str = SCHEDULE["exchange"][0]
    nesting: str = SCHEDULE["nesting"][0]
    overlap: str = SCHEDULE["overlap"][0]
    latency: str = SCHEDULE["latency"][0]
    attention: str = SCHEDULE["attention"][0]

    def __post_init__(self):
        for key, values in SCHEDULE.items():
            if getattr(self, key) not in values:
                raise Invalid(key, getattr(self, key), f"one of {', '.join(values)}")


@dataclasses.dataclass(frozen=True)
class ComputeKeys:
    """A device's compute rates as a cluster file gives them."""

    tflop_s: float
    memory_gb_s: float

    def __post_init__(self):
        _positive("tflop_s", self.tflop_s)
        _positive("memory_gb_s", self.memory_gb_s)


@dataclasses.dataclass(frozen=True)
class ClusterKeys:
    """The keys of a cluster file (the module's docstring); `from_dict` makes the `Cluster`."""

    nodes: int
    devices_per_node: int
    memory_gib: float
    links: LinksKeys
    name: str | None = None
    codecs: dict[Any, SpeedKeys] | None = None
    schedule: ScheduleKeys | None = None
    compute: ComputeKeys | None = None
    source: str = ""

    def __post_init__(self):
        for key in ("nodes", "devices_per_node"):
            if getattr(self, key) < 1:
                raise Invalid(key, getattr(self, key), "a positive integer")
        _positive("memory_gib", self.memory_gib)


assert tuple(f.name for f in dataclasses.fields(TableKeys)) == TABLE_OPS


def from_dict(data, where: str = "cluster") -> Cluster:
    """A Cluster from a mapping; errors are one line naming the key."""
    keys = structure(ClusterKeys, data, kind="cluster", where=where)
    links = keys.links
    if links.inter is not None:
        inter = links.inter.link()
    elif keys.nodes == 1:
        inter = links.intra.link()
    else:
        raise ValueError(f"{where}: cluster key 'links.inter' is missing ({keys.nodes} nodes)")
    if links.inter_collectives is not None and keys.nodes == 1:
        raise ValueError(f"{where}: links.inter_collectives needs more than one node")
    codecs = {}
    for spec, speeds in (keys.codecs or {}).items():
        try:
            codec = parse(str(spec))
        except ValueError as e:
            raise ValueError(f"{where}: codecs.{spec}: {e}") from None
        if codec is None or codec.spec == "none":
            raise ValueError(f"{where}: codecs.{spec}: 'none' has no speed to give")
        codecs[codec.spec] = CodecSpeed(speeds.encode_gb_s * 1e9, speeds.decode_gb_s * 1e9)
    schedule = keys.schedule or ScheduleKeys()
    compute = None
    if keys.compute is not None:
        compute = ComputeRate(keys.compute.tflop_s * 1e12, keys.compute.memory_gb_s * 1e9)
    return Cluster(
        keys.name if keys.name is not None else os.path.splitext(os.path.basename(where))[0],
        keys.nodes,
        keys.devices_per_node,
        keys.memory_gib * 2**30,
        links.intra.link(),
        inter,
        codecs,
        keys.source,
        _table(links.collectives, keys.devices_per_node, "links.collectives", where),
        _table(links.inter_collectives, None, "links.inter_collectives", where),
        *(getattr(schedule, k) for k in SCHEDULE),
        compute=compute,
    )


def _table(table: TableKeys | None, per_node: int | None, key: str, where: str) -> dict:
    """A link table (`key`) as {(op, ranks): Link}; group sizes are integers >= 2, at most
    `per_node` when given (YAML writes them as numbers, JSON as strings: both read)."""
    out = {}
    for op in TABLE_OPS:
        for k, figures in (getattr(table, op, None) or {}).items():
            at = f"{where}: {key}.{op}.{k}"
            ranks = int(k) if isinstance(k, str) and k.isdigit() else k
            if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
                raise ValueError(f"{at}: a group size must be an integer >= 2")
            if per_node is not None and ranks > per_node:
                raise ValueError(
                    f"{at}: a group of {ranks} ranks does not fit a node of {per_node}"
                )
            out[(op, ranks)] = figures.link()
    return out


def load(path: str) -> Cluster:
    from jaxhc.schema import read_yaml

    if not os.path.exists(path):
        raise ValueError(f"--cluster {path!r} does not exist")
    return from_dict(read_yaml(path), where=path)


# What `jaxhc train --plan auto` assumes for this machine: one node of the run's devices, at the
# speeds `jaxhc profile --links` measured here (bench/results/plan_profile.yaml, 8 host devices
# on 2 cores, load average ~1.9), links.collectives included.
LOCAL_DEFAULTS = {
    "links": {
        "intra": {"gbit_s": 17.767, "latency_us": 19.3},
        "collectives": {  # op: {group size: figures}
            "all_gather": {
                2: {"gbit_s": 9.203, "latency_us": 0.0},
                4: {"gbit_s": 15.14, "latency_us": 20.56},
                8: {"gbit_s": 22.26, "latency_us": 24.1},
            },
            "psum_scatter": {
                2: {"gbit_s": 9.166, "latency_us": 0.0},
                4: {"gbit_s": 18.13, "latency_us": 53.43},
                8: {"gbit_s": 28.04, "latency_us": 41.7},
            },
            "all_to_all": {
                2: {"gbit_s": 2.733, "latency_us": 0.0},
                4: {"gbit_s": 4.276, "latency_us": 0.0},
                8: {"gbit_s": 5.078, "latency_us": 58.15},
            },
            "psum": {
                2: {"gbit_s": 13.1, "latency_us": 0.0},
                4: {"gbit_s": 19.3, "latency_us": 0.0},
                8: {"gbit_s": 24.43, "latency_us": 7.159},
            },
        },
    },
    "codecs": {
        "zfp:8": {"encode_gb_s": 1.6386, "decode_gb_s": 1.6579},
        "zfp:16": {"encode_gb_s": 1.0868, "decode_gb_s": 0.9422},
        "q8": {"encode_gb_s": 3.1942, "decode_gb_s": 2.8365},
        "mpc": {"encode_gb_s": 0.8109, "decode_gb_s": 0.7162},
    },
}


def local(devices: int, memory_gib: float = 4.0) -> Cluster:
    """This machine as one node of `devices` devices, at `LOCAL_DEFAULTS` (the measured groups
    that fit the node)."""
    links = LOCAL_DEFAULTS["links"]
    collectives = {
        op: {k: v for k, v in groups.items() if k <= devices}
        for op, groups in links["collectives"].items()
    }
    collectives = {op: groups for op, groups in collectives.items() if groups}
    return from_dict(
        {
            "name": "local",
            "nodes": 1,
            "devices_per_node": devices,
            "memory_gib": memory_gib,
            "links": {
                "intra": links["intra"],
                **({"collectives": collectives} if collectives else {}),
            },
            "codecs": LOCAL_DEFAULTS["codecs"],
            "source": "jaxhc.plan.cluster.LOCAL_DEFAULTS",
        },
        where="local",
    )
