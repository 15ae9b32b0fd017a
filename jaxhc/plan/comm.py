"""The time of one collective of a step on one device (`Comm`), and a step's communication.

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
nodes its group spans (in place of ``links.inter``: `Cluster.inter_link`); under
``schedule.latency: crossing`` a ring across nodes pays the inter-node latency only for its
node-crossing steps (`Comm.latency`: NCCL's ring latency model). On the MPI transport
(``Layout.transport``) a psum, reduce-scatter or all-gather under a codec the native engine
fuses (a gradient reduce-scatter with error feedback included; `native`, the runtime's rule) is
one fused native call: its segments of `MpiTransport.SEGMENT_BYTES` raw bytes are
encoded, sent and decoded in a pipeline, so its wire time W and codec time C give
max(W, C) + min(W, C) / S for S segments of a rank's chunk (a two-stage pipeline of equal
segments), and its flags travel in the messages (only the reduce-scatter, whose ranks see only
their own pieces, agrees in an extra all-reduce).

`comm_time` is the collectives one after the other: a step's communication time, none of it
hidden. What the step hides behind its compute is `jaxhc.plan.steptime`'s.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from jaxhc.codecs import Codec
from jaxhc.collectives import volume
from jaxhc.plan.cluster import Cluster, Link
from jaxhc.transport import MpiTransport

__all__ = ["Comm", "comm_bytes", "comm_time", "dtype_of", "native", "wire_bytes"]

RING_OPS = ("psum", "psum_scatter", "all_gather", "broadcast")  # ring passes over the group


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
    # where the step runs it (what `jaxhc.plan.steptime` may hide): "gather" (parameters before a
    # layer), "reduce" (gradients), "exchange" (parameters after the update), "" (activations,
    # the pipeline's end stages' gradient pair: inside the layers or after the backward)
    role: str = ""
    feedback: bool = False  # it carries an error-feedback residual (a gradient reduce-scatter)

    @property
    def raw(self) -> float:
        """Raw bytes per call (ring): `jaxhc.collectives.volume.raw`, as the ledger counts them."""
        return volume.raw(self.op, self.ranks, self.message * self.itemsize)

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
        flag (an all-reduce of an int32 per rank, `jaxhc.collectives.volume.agreement`)."""
        k = self.ranks
        steps = volume.steps(self.op, k)
        if self.codec is None or self.codec.spec == "none":
            return [(self.op, steps, self.raw)]
        agree = volume.agreement(self.codec, k)
        payload = self.wire - agree
        if self.fused:  # the call's own schedule; flags in its messages but a scatter's
            agreed = self.op == "psum_scatter" and agree
            flags = [("psum", volume.steps("psum", k), agree)] if agreed else []
            return [(self.op, steps, payload), *flags]
        a2a, gather = volume.steps("all_to_all", k), volume.steps("all_gather", k)
        if self.op == "psum_scatter":
            out = [("all_to_all", a2a, payload)]
        elif self.op == "psum":
            out = [("all_to_all", a2a, payload / 2), ("all_gather", gather, payload / 2)]
        else:
            out = [(self.op, steps, payload)]
        return out + [("psum", volume.steps("psum", k), agree)] if agree else out

    def latency(self, cluster: Cluster, op: str, steps: int, link: Link) -> float:
        """Seconds of `steps` latencies of `op` over this group at `link`'s: every step at it,
        or under ``schedule.latency: crossing`` (NCCL's ring model) a ring across nodes pays
        it only for the steps that cross a node boundary (n - 1 of a pass's k - 1 over n
        nodes) and ``links.intra``'s for the rest."""
        ring = op in RING_OPS and self.span > cluster.devices_per_node and self.ranks > 1
        if cluster.latency != "crossing" or not ring:
            return steps * link.latency
        nodes = -(-self.ranks // self.per_node)
        crossing = steps * (nodes - 1) / (self.ranks - 1)
        return crossing * link.latency + (steps - crossing) * cluster.intra.latency

    def seconds(self, cluster: Cluster) -> float:
        latency = wire = codec = 0.0
        for op, steps, nbytes in self.legs():
            own = cluster.collective_link(op, self.ranks, self.span)
            if own is not None:  # links.collectives: this op's figures for its group size
                latency += steps * own.latency
                wire += nbytes / own.bandwidth
            else:
                link = self.link(cluster, op)
                latency += self.latency(cluster, op, steps, link)
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
            segments = max(1, math.ceil(chunk / MpiTransport.SEGMENT_BYTES))
            return self.count * (latency + max(wire, codec) + min(wire, codec) / segments)
        return self.count * (latency + wire + codec)


def native(transport: str, codec, op: str, itemsize: int, feedback: bool = False) -> bool:
    """Whether `transport` runs the call as one native call of the MPI engine (a plain one
    without a codec), which it can also start (`jaxhc.collectives.started`): the runtime's rule,
    `MpiTransport.fuses`. A compressed one is `Comm.fused`.

    >>> from jaxhc.codecs import parse
    >>> [native("mpi", parse("zfp:8"), "psum_scatter", 4, ef) for ef in (False, True)]
    [True, True]
    >>> native("mpi", None, "psum_scatter", 4, feedback=True), native("xla", None, "psum", 4)
    (False, False)
    """
    return transport == "mpi" and MpiTransport.fuses(codec, dtype_of(itemsize), op, feedback)


def dtype_of(itemsize: int):
    """The float dtype of `itemsize` bytes the planner moves: float32, or bfloat16 (mixed).

    >>> jaxhc.plan.comm.dtype_of(2).__name__
    'bfloat16'
    """
    return jnp.float32 if itemsize == 4 else jnp.bfloat16


def wire_bytes(codec, op: str, ranks: int, message: int, itemsize: int, raw: float) -> float:
    """What jaxhc's algorithms move for one call under `codec` (None: `raw`): the codec's static
    payload per row (rows padded to `ROW_MULTIPLE`) and the fallback agreement flags."""
    if codec is None or codec.spec == "none":
        return raw
    return volume.compressed(codec, op, ranks, message, dtype_of(itemsize))


def comm_time(comms: list[Comm], cluster: Cluster) -> float:
    """Seconds of `comms` run one after the other."""
    return sum(c.seconds(cluster) for c in comms)


def comm_bytes(comms: list[Comm]) -> float:
    """Wire bytes of `comms` per step."""
    return sum(c.count * c.wire for c in comms)
