"""Rank the sharding plans of a model on a cluster: communication time under a memory limit.

Candidates are every valid (s_g, s_os) of `jaxhc.model.config.ShardConfig` with s_p = 1 (sharded
parameters are not implemented yet) on the data axis nested as the cluster's nodes nest it: a
group of the data ranks in one node (when the node holds more than one and fewer than all), then
the whole axis; and, for comparison, the plans of a flat data axis (DDP, ZeRO-1/2 reduced in one
level across the nodes). AMSP's own search also varies s_p and nests groups inside a node; here
the nodes' boundary is the one level that changes the links.
"""

from __future__ import annotations

import dataclasses

from jaxhc.model.config import GPTConfig, MeshConfig, ShardConfig
from jaxhc.parallel.state import Plan
from jaxhc.plan.memory import StateBytes, state_bytes
from jaxhc.plan.traffic import Links, data_collectives, step_time


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan: its sizes, per-device bytes, data-axis bytes and time per step, and why it was
    rejected (empty when it fits)."""

    shard: ShardConfig
    memory: StateBytes
    comm_bytes: float
    comm_seconds: float
    rejected: str = ""

    @property
    def sizes(self) -> tuple[int, int, int]:
        return (1, self.shard.grads, self.shard.optim)


def node_groups(mesh: MeshConfig, links: Links) -> tuple[int, ...]:
    """The data ranks one node holds, as a nesting level when it is one (else none)."""
    per_node = links.node_devices // (mesh.tensor * mesh.pipe)
    return (per_node,) if 1 < per_node < mesh.data and mesh.data % per_node == 0 else ()


def candidates(model: GPTConfig, mesh: MeshConfig, links: Links, memory: float, policy=None):
    """Every plan on the node nesting, best first: those that fit in `memory` bytes per device by
    communication time (then memory), then the rejected ones; bytes moved under `policy`."""
    groups = node_groups(mesh, links)
    flat_bytes = 4 * Plan(model, mesh).layout.padded
    out = []
    plans = [(g, o, groups) for o in sorted({1, *groups, mesh.data}) for g in sorted({1, o})]
    if groups:  # the plans a flat data axis admits too, reduced across nodes in one level
        plans += [(g, o, ()) for g, o, _ in plans if o in (1, mesh.data)]
    for grads, optim, nesting in plans:
        shard = ShardConfig(params=1, grads=grads, optim=optim, groups=nesting)
        m = dataclasses.replace(mesh, shard=shard)
        mem = state_bytes(model, m)
        colls = data_collectives(m, flat_bytes)
        comm = sum(c.wire(policy) for c in colls)
        rejected = ""
        if mem.total > memory:
            rejected = f"out of memory: {mem.total / 2**30:.2f} GiB > {memory / 2**30:.2f} GiB"
        out.append(Candidate(shard, mem, comm, step_time(colls, m, links, policy), rejected))
    return sorted(out, key=lambda c: (bool(c.rejected), c.comm_seconds, c.memory.total))


def table(rows: list[Candidate]) -> str:
    """A markdown table of `rows`."""
    lines = [
        "| s_p | s_g | s_os | groups | P GiB | G GiB | OS GiB | total GiB | comm MiB | comm ms |"
        " rejected |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in rows:
        m = c.memory
        gib = [x / 2**30 for x in (m.params, m.grads, m.optim, m.total)]
        lines.append(
            f"| {' | '.join(map(str, c.sizes))} | {list(c.shard.groups) or 'flat'} | "
            + " | ".join(f"{g:.3f}" for g in gib)
            + f" | {c.comm_bytes / 2**20:.1f} | {c.comm_seconds * 1e3:.2f} | {c.rejected} |"
        )
    return "\n".join(lines)
