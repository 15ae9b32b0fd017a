"""A plan `jaxhc train` takes: a mesh (with its ``shard`` split) and a compression policy.

`jaxhc plan --write` writes the best plan as a YAML file; `jaxhc train --plan FILE` reads it
(`Plan.load`) and `apply` s it to the run's config, as objects. ``--plan auto`` asks the planner
for the run's devices as one node of this machine (`auto`)::

    plan: {model: gpt2-small, cluster: a100-1024, predicted_comm_s: 0.0123, ...}  # kept, not read
    mesh: {data: 8, tensor: 1, pipe: 1, microbatches: 1,
           shard: {params: 1, grads: 8, optim: 8, groups: [8], gather: layer}}
    compression: none       # a preset, a policy YAML path, or a policy mapping
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxhc.plan.cost import codec_by_policy, spec_policy
from jaxhc.plan.search import Candidate, search
from jaxhc.schema import read_yaml, structure

__all__ = ["Plan", "apply", "auto", "best", "plans"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A plan file's keys: ``mesh`` overrides the config's mesh key by key (``shard`` too),
    ``compression`` (None: the config's own) replaces its policy, ``plan`` says what the planner
    predicted (information only).

    >>> from jaxhc.plan import Plan
    >>> Plan(mesh={"data": 2})
    Plan(mesh={'data': 2}, compression=None, plan=None)
    >>> jaxhc.schema.structure(Plan, {"mesh": {"data": 2}, "extra": 1}, kind="plan")
    Traceback (most recent call last):
    ValueError: unknown plan key 'extra'
    """

    mesh: dict[str, Any]
    compression: Any = None
    plan: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: str) -> Plan:
        import os

        if not os.path.exists(path):
            raise ValueError(f"--plan {path!r} does not exist (a plan YAML or 'auto')")
        return structure(cls, read_yaml(path), kind="plan", where=f"--plan {path}")

    @classmethod
    def from_candidate(cls, cand: Candidate, compression=None, model=None, cluster=None) -> Plan:
        """The plan of planner row `cand`: its mesh, and `compression` when given (the policy its
        traffic was priced under), else its codec on the data levels that cross `cluster`'s
        nodes (`jaxhc.plan.cost.spec_policy`); ``plan`` names `model` and `cluster`."""
        lay = cand.layout
        if compression is not None:
            policy = compression
        else:  # the policy the planner priced it under (`codec_by_spec(...).policy`)
            policy = spec_policy(lay.codec, lay, cluster) or "none"
        info = {
            "model": model,
            "cluster": cluster.name if cluster is not None else None,
            "predicted_comm_s": round(cand.comm_seconds, 6),
            "predicted_memory_gib": round(cand.memory.total / 2**30, 4),
        }
        return cls(mesh=lay.mesh_overrides(), compression=policy, plan=info)

    def dump(self, path: str) -> None:
        """Write the plan as YAML (``plan``, ``mesh``, ``compression``)."""
        import yaml

        data = {"plan": self.plan, "mesh": self.mesh, "compression": self.compression}
        with open(path, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)


def apply(cfg, plan: Plan):
    """`cfg` (an `ExperimentConfig`) trained under `plan`: its mesh keys replaced by the plan's
    (``mesh.shard`` key by key), its policy by the plan's when the plan names one.

    >>> from jaxhc.plan import Plan, apply
    >>> from jaxhc.train.config import load
    >>> cfg = apply(load(None), Plan(mesh={"data": 4, "shard": {"optim": 2}}, compression="zfp8"))
    >>> cfg.mesh.data, cfg.mesh.tensor, cfg.mesh.shard.optim, cfg.policy.name
    (4, 2, 2, 'zfp8')
    """
    from jaxhc.model.config import MeshConfig
    from jaxhc.policy import Policy

    mesh = structure(MeshConfig, plan.mesh, prefix="mesh", base=cfg.mesh)
    compression = cfg.compression
    if isinstance(plan.compression, Mapping):
        compression = Policy.from_dict(plan.compression, name="plan")
    elif plan.compression is not None:
        compression = str(plan.compression)
    return dataclasses.replace(cfg, mesh=mesh, compression=compression)


def plans(
    shape,
    cluster,
    batch,
    seq,
    *,
    codecs=("none",),
    compression=None,
    precision="float32",
    mesh=None,
    model_parallel="min",
    transport="xla",
    micro_batch=None,
) -> list[Candidate]:
    """`jaxhc.plan.search` with `jaxhc plan`'s choices: `mesh` fixes tensor, pipe and
    microbatches (data follows from the devices), or `micro_batch` the sequences of a
    micro-batch; `compression` (a policy) prices every plan's traffic instead of trying
    `codecs` on the levels that cross nodes."""
    mesh = mesh or {}
    if "data" in mesh:
        raise ValueError("--mesh: data follows from the cluster's devices; give tensor and pipe")
    if micro_batch is not None and "microbatches" in mesh:
        raise ValueError("give --micro-batch or --mesh microbatches=, not both")
    codec_of = None
    if compression is not None:
        codec_of, codecs = codec_by_policy(compression), (f"policy {compression}",)
    return search(
        shape,
        cluster,
        batch,
        seq,
        codecs=codecs,
        precision=precision,
        microbatches=mesh.get("microbatches"),
        tensors=[mesh["tensor"]] if "tensor" in mesh else None,
        pipes=[mesh["pipe"]] if "pipe" in mesh else None,
        codec_of=codec_of,
        model_parallel=model_parallel,
        transport=transport,
        micro_batch=micro_batch,
    )


def best(rows: list[Candidate], *, whole_params: bool = False) -> Candidate | None:
    """The best ranked plan `jaxhc train` can take (it fits, and jaxhc trains its layout); with
    `whole_params` one that keeps the parameters whole (s_p = 1: what the sampled gradient
    fidelity, ``train.fidelity_every``, needs)."""
    return next(
        (
            c
            for c in rows
            if not c.rejected
            and c.trainable == "yes"
            and (c.layout.params == 1 or not whole_params)
        ),
        None,
    )


def auto(cfg) -> Candidate:
    """The best plan for `cfg`'s devices as one node of this machine (`jaxhc.plan.cluster.local`,
    its memory from `jaxhc.plan.profile.memory_gib`), under `cfg`'s policy and transport."""
    from jaxhc.plan import cluster as clusters
    from jaxhc.plan.profile import memory_gib
    from jaxhc.plan.shapes import from_gpt

    devices = cfg.mesh.size
    rows = plans(
        from_gpt("model", cfg.model),
        clusters.local(devices, memory_gib(devices)),
        cfg.train.batch_size,
        cfg.model.block_size,
        compression=cfg.compression,
        transport=cfg.transport,
    )
    cand = best(rows, whole_params=cfg.train.fidelity_every > 0)
    if cand is None:
        raise ValueError(f"--plan auto: no plan for {devices} devices fits and trains")
    return cand
