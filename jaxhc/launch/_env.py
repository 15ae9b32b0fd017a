"""Where this process sits in a multi-process job: from mpirun, SLURM or jaxhc's own variables."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

# Coordinator ports fall in the top 4096 ports, offset by the job id (as jax's cluster detection).
_PORT_BASE = 65535 - 2**12 + 1


@dataclasses.dataclass(frozen=True)
class ProcessEnv:
    """This process's place in the job, read from the launcher's environment variables.

    source: "jaxhc" (JAXHC_PROCESS_ID / JAXHC_NUM_PROCESSES / JAXHC_COORDINATOR), "mpirun"
    (OMPI_COMM_WORLD_*), "slurm" (SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST, ...) or
    "single" (none of these: one process). `coordinator` is host:port for `jax.distributed`.

    >>> from jaxhc.launch import ProcessEnv
    >>> env = ProcessEnv.from_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
    ...                            "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242"})
    >>> env.process_id, env.num_processes, env.local_rank, env.coordinator, env.source
    (3, 8, 1, 'gpu07:61586', 'slurm')
    """

    process_id: int
    num_processes: int
    local_rank: int
    local_size: int | None
    coordinator: str | None
    source: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, port: int | None = None):
        """Read the environment (`os.environ` by default); `port` overrides the coordinator port."""
        env = os.environ if environ is None else environ
        port = port if port is not None else _int(env.get("JAXHC_COORDINATOR_PORT"))
        if "JAXHC_NUM_PROCESSES" in env:
            return cls(
                process_id=int(env.get("JAXHC_PROCESS_ID", "0")),
                num_processes=int(env["JAXHC_NUM_PROCESSES"]),
                local_rank=int(env.get("JAXHC_LOCAL_RANK", env.get("JAXHC_PROCESS_ID", "0"))),
                local_size=_int(env.get("JAXHC_LOCAL_SIZE")),
                coordinator=_with_port(env.get("JAXHC_COORDINATOR"), port),
                source="jaxhc",
            )
        if "OMPI_COMM_WORLD_SIZE" in env:
            size = int(env["OMPI_COMM_WORLD_SIZE"])
            local_size = _int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE"))
            return cls(
                process_id=int(env["OMPI_COMM_WORLD_RANK"]),
                num_processes=size,
                local_rank=int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")),
                local_size=local_size,
                coordinator=_ompi_coordinator(env, port, single_node=local_size == size),
                source="mpirun",
            )
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            job = _int(env.get("SLURM_JOB_ID")) or 0
            host = first_host(nodes) if nodes else None
            return cls(
                process_id=int(env["SLURM_PROCID"]),
                num_processes=int(env["SLURM_NTASKS"]),
                local_rank=int(env.get("SLURM_LOCALID", "0")),
                local_size=_int(env.get("SLURM_NTASKS_PER_NODE")),
                coordinator=None if host is None else f"{host}:{port or _PORT_BASE + job % 2**12}",
                source="slurm",
            )
        return cls(0, 1, 0, 1, None, "single")

    @property
    def multi_process(self) -> bool:
        return self.num_processes > 1


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "gpu[007-009,012],cpu01" -> "gpu007".

    >>> from jaxhc.launch import first_host
    >>> first_host("gpu[007-009,012],cpu01"), first_host("node3")
    ('gpu007', 'node3')
    """
    m = re.match(r"\s*([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise ValueError(f"cannot read a host from the SLURM node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _ompi_coordinator(env, port, single_node):
    uri = env.get("OMPI_MCA_orte_hnp_uri") or env.get("PMIX_SERVER_URI41") or ""
    job = uri.split(".", 1)[0]
    chosen = port or _PORT_BASE + (int(job) // 2**12 if job.isdigit() else 0) % 2**12
    if single_node:
        return f"127.0.0.1:{chosen}"
    m = re.search(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]", uri)
    if m is None:
        return None
    return f"{next(g for g in m.groups() if g is not None)}:{chosen}"


def _with_port(addr, port):
    if addr is None or port is None or ":" in addr.rsplit("]", 1)[-1]:
        return addr
    return f"{addr}:{port}"


def _int(v):
    """The leading integer of a variable ("4", or SLURM's "4(x2)"), None when unset or empty."""
    m = re.match(r"\s*(\d+)", v or "")
    return int(m.group(1)) if m else None


def host_devices(cfg, env=None) -> int:
    """The devices this process needs: one per process under ``--transport mpi`` (mpirun starts
    a process per mesh device); under ``--transport xla`` its share of the mesh (the whole mesh in
    one process; the mesh split evenly over the processes of a `jax.distributed` job started by
    mpirun, srun or jaxhc's JAXHC_* variables).

    >>> from jaxhc.launch import ProcessEnv, host_devices
    >>> from jaxhc.train.config import load
    >>> host_devices(load(None), ProcessEnv.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}))
    4
    """
    if cfg.transport == "mpi":
        return 1
    env = env or ProcessEnv.from_env()
    if cfg.mesh.size % env.num_processes:
        raise ValueError(
            f"mesh size {cfg.mesh.size} is not a multiple of the {env.num_processes} processes "
            f"of this job (started by {env.source}): each process takes an equal share"
        )
    return cfg.mesh.size // env.num_processes
