"""A cluster as the planner sees it: nodes, devices, memory, links per level, codec speeds,
compute rates and how the training system schedules a plan's collectives (`Cluster`).

A cluster file's keys, and `from_dict`, `load` and `local` (this machine as one node), are
`jaxhc.plan.clusterfile`'s; they are reachable here too (``jaxhc.plan.cluster.load``).
"""

from __future__ import annotations

import dataclasses
import math

import yaml

from jaxhc.codecs import parse

# What moves a collective's bytes inside a node (`jaxhc.plan.comm.Comm.legs`): a compressed
# reduce-scatter's payloads go by an all-to-all, a fallback flag's agreement by a tiny all-reduce.
COLLECTIVE_OPS = ("all_gather", "psum_scatter", "all_to_all", "psum")
TABLE_OPS = (*COLLECTIVE_OPS, "broadcast")  # what the link tables give figures for
SCHEDULE = {  # schedule key: its values, the default (jaxhc's step) first
    "gradients": ("scatter", "all_reduce"),
    "exchange": ("all_gather", "broadcast"),
    "nesting": ("node", "sizes"),
    "overlap": ("jaxhc", "amsp", "none"),
    "latency": ("inter", "crossing"),
    "attention": ("materialized", "fused"),
}


@dataclasses.dataclass(frozen=True)
class Link:
    """Bandwidth (bytes/s per device) and per-message latency (s) of one level of links."""

    bandwidth: float
    latency: float

    def to_dict(self) -> dict:
        return {
            "gbit_s": _round(self.bandwidth * 8 / 1e9),
            "latency_us": _round(self.latency * 1e6),
        }


@dataclasses.dataclass(frozen=True)
class CodecSpeed:
    """Encode and decode speeds of a codec on one device, bytes/s of raw input/output values."""

    encode: float
    decode: float

    def to_dict(self) -> dict:
        return {"encode_gb_s": _round(self.encode / 1e9), "decode_gb_s": _round(self.decode / 1e9)}


@dataclasses.dataclass(frozen=True)
class ComputeRate:
    """A device's matrix-product rate (FLOP/s) and the optimizer update's memory rate (bytes/s)."""

    flops: float
    memory: float

    def to_dict(self) -> dict:
        return {"tflop_s": _round(self.flops / 1e12), "memory_gb_s": _round(self.memory / 1e9)}


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A cluster: nodes of devices, the links within and between nodes, codec speeds (a
    cluster file, `jaxhc.plan.cluster.load`).

    >>> cluster = jaxhc.plan.cluster.from_dict({
    ...     "name": "two-nodes", "nodes": 2, "devices_per_node": 4, "memory_gib": 16,
    ...     "links": {"intra": {"gbit_s": 800, "latency_us": 5},
    ...               "inter": {"gbit_s": 100, "latency_us": 10}},
    ...     "codecs": {"zfp:8": {"encode_gb_s": 50, "decode_gb_s": 50}}})
    >>> cluster.devices, cluster.link(8).bandwidth        # a group across nodes: the NIC's bytes/s
    (8, 12500000000.0)
    """

    name: str
    nodes: int
    devices_per_node: int
    memory: float  # bytes per device
    intra: Link
    inter: Link
    codecs: dict  # codec spec -> CodecSpeed
    source: str = ""
    collectives: dict = dataclasses.field(default_factory=dict)  # (op, ranks) -> Link, in a node
    inter_collectives: dict = dataclasses.field(default_factory=dict)  # (op, ranks) -> Link
    gradients: str = "scatter"  # schedule.gradients
    exchange: str = "all_gather"  # schedule.exchange
    nesting: str = "node"  # schedule.nesting
    overlap: str = "jaxhc"  # schedule.overlap
    latency: str = "inter"  # schedule.latency
    attention: str = "materialized"  # schedule.attention
    compute: ComputeRate | None = None  # compute: None, communication only

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def link(self, devices_spanned: int) -> Link:
        """The links of a collective whose group spans `devices_spanned` consecutive devices."""
        return self.intra if devices_spanned <= self.devices_per_node else self.inter

    def collective_link(self, op: str, ranks: int, devices_spanned: int) -> Link | None:
        """``links.collectives``' figures for `op` over `ranks` ranks when its group fits a node
        and the file gives them, else None (the level's `link` applies)."""
        if devices_spanned > self.devices_per_node:
            return None
        return self.collectives.get((op, ranks))

    def inter_link(self, op: str, nodes: int) -> Link:
        """Per-NIC-share bandwidth and per-step latency of `op` over a group spanning `nodes`
        nodes: ``links.inter_collectives`` interpolated in log(nodes), else ``links.inter``."""
        sizes = sorted(k for o, k in self.inter_collectives if o == op)
        if not sizes:
            return self.inter
        lo = max([k for k in sizes if k <= nodes] or sizes[:1])
        hi = min([k for k in sizes if k >= nodes] or sizes[-1:])
        a, b = self.inter_collectives[(op, lo)], self.inter_collectives[(op, hi)]
        if lo == hi:
            return a
        w = math.log(nodes / lo) / math.log(hi / lo)
        bandwidth = a.bandwidth ** (1 - w) * b.bandwidth**w
        return Link(bandwidth, (1 - w) * a.latency + w * b.latency)

    def speed(self, spec: str) -> CodecSpeed:
        key = parse(spec).spec
        family = key.split(":")[0]  # "mpc:0.8" takes the speed of "mpc" when it has none
        if key not in self.codecs and family in self.codecs and family == "mpc":
            key = family
        if key not in self.codecs:
            raise ValueError(
                f"cluster {self.name}: no speed for codec {key!r} (add codecs.{key}: "
                "{encode_gb_s: ..., decode_gb_s: ...}, or run `jaxhc profile`)"
            )
        return self.codecs[key]

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "memory_gib": _round(self.memory / 2**30),
            "links": {"intra": self.intra.to_dict(), "inter": self.inter.to_dict()},
            "codecs": {k: v.to_dict() for k, v in self.codecs.items()},
        }
        if self.collectives:
            table: dict = {}
            for (op, k), link in self.collectives.items():
                table.setdefault(op, {})[k] = link.to_dict()
            out["links"]["collectives"] = table
        if self.inter_collectives:
            table = {}
            for (op, k), link in self.inter_collectives.items():
                table.setdefault(op, {})[k] = link.to_dict()
            out["links"]["inter_collectives"] = table
        schedule = {k: getattr(self, k) for k in SCHEDULE if getattr(self, k) != SCHEDULE[k][0]}
        if schedule:
            out["schedule"] = schedule
        if self.compute is not None:
            out["compute"] = self.compute.to_dict()
        if self.source:
            out["source"] = self.source
        return out

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False, width=100)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


_FILE = ("from_dict", "load", "local", "LOCAL_DEFAULTS")


def __getattr__(name: str):
    """`jaxhc.plan.clusterfile`'s readers, as attributes of this module."""
    if name in _FILE:
        from jaxhc.plan import clusterfile

        return getattr(clusterfile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
