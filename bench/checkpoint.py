"""Checkpoint save and restore under MPI: time and peak extra host memory per rank.

    mpirun -np 4 .venv/bin/python bench/checkpoint.py --layers 10 --width 768 --dir /tmp/ck
    mpirun -np 4 .venv/bin/python bench/checkpoint.py --mode gather ...   # the previous way

A GPT train state (`--layers`, `--width`; 10 x 768 is 1.1 GB: float32 parameters plus AdamW's
moments and master copy) on a data x tensor x pipe mesh of the job's size (`--mesh 4,1,1` by
default), every rank holding its block (random values) as jax arrays. `--repeats` saves and
restores, each after a barrier; of the ranks' times the slowest counts, the best repeat is
reported, and each rank's largest peak over the repeats. Two ways:

- `sharded` (jaxhc.train.checkpoint): every rank writes its own pieces and reads its own block.
- `gather`: what jaxhc did before sharded checkpoints: each leaf's blocks gathered to rank 0 with
  mpi4py (pickled), assembled, written there with Orbax (StandardSave); restored on rank 0 and
  scattered back.

Peak extra memory: a thread samples the process's resident set every 2 ms during the call; the
peak minus the resident set just before it. `share MiB` is the rank's own block. Rank 0 prints a
table and writes the JSON with the command and the machine's load average (--out, default
bench/results/checkpoint_<mode>_np<P>.json).
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time

import jax
import numpy as np
from _common import write_json
from mpi4py import MPI

from jaxhc import partition
from jaxhc.model.config import AXES, GPTConfig, MeshConfig, OptimConfig
from jaxhc.parallel.canonical import Canonical
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Checkpoints, all_finite
from jaxhc.train.mpi import MpiGroup

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """The peak resident set above the one at entry, sampled by a thread."""

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
        self.extra = self.peak - self.base


def to_jax(leaves: list) -> list:
    """Host arrays -> jax arrays, one at a time, each host array let go once copied (so the copy
    costs the largest leaf, not a second block)."""
    out = []
    while leaves:
        out.append(jax.numpy.asarray(leaves.pop(0)))
    return out


class Sharded:
    def __init__(self, comm, plan, coords, directory):
        self.plan, self.coords = plan, coords
        self.ckpt = Checkpoints(directory, keep=1, group=MpiGroup(comm))

    def save(self, step, leaves):
        self.ckpt.save(step, self.plan, [(self.coords, leaves)], finite=all_finite(leaves))

    def restore(self, step):
        [(_, leaves)] = self.ckpt.restore(self.plan, [self.coords], step)
        return to_jax(leaves)


class Gather:
    """The previous checkpoints: gathered to rank 0, Orbax there, scattered back."""

    def __init__(self, comm, plan, coords, directory):
        try:
            import orbax.checkpoint as ocp
        except ImportError:
            raise SystemExit(
                "bench/checkpoint.py --mode gather needs Orbax: .venv/bin/pip install -e '.[bench]'"
            ) from None

        self.ocp, self.comm, self.plan = ocp, comm, plan
        self.mesh = dict(zip(AXES, plan.mesh_cfg.shape, strict=True))
        self.all_coords = comm.allgather(coords)
        self.specs = jax.tree.leaves(plan.state_specs, is_leaf=partition.is_spec)
        self.shapes = jax.tree.leaves(Canonical(plan).global_shapes())
        self.manager = None
        if comm.Get_rank() == 0:
            options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
            self.manager = ocp.CheckpointManager(directory, options=options)

    def save(self, step, leaves):
        host = []
        for spec, x in zip(self.specs, leaves, strict=True):
            blocks = self.comm.gather(np.asarray(x), root=0)
            if blocks:
                host.append(partition.assemble(spec, blocks, self.all_coords, self.mesh))
        if self.manager is not None and all_finite(host):
            self.manager.save(step, args=self.ocp.args.StandardSave(host), force=True)
            self.manager.wait_until_finished()
        self.comm.bcast(True, root=0)

    def restore(self, step):
        host = None
        if self.manager is not None:
            like = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in self.shapes]
            host = self.manager.restore(step, args=self.ocp.args.StandardRestore(like))
        out = []
        for i, spec in enumerate(self.specs):
            blocks = None
            if host is not None:
                x = np.asarray(host[i])
                blocks = [partition.local_block(spec, x, c, self.mesh) for c in self.all_coords]
            out.append(jax.numpy.asarray(self.comm.scatter(blocks, root=0)))
        return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("sharded", "gather"), default="sharded")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--mesh", default="4,1,1", help="data,tensor,pipe")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/jaxhc-bench-checkpoint")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    d, t, p = (int(v) for v in args.mesh.split(","))
    if d * t * p != size:
        raise SystemExit(f"--mesh {args.mesh} has {d * t * p} devices; the job has {size} ranks")
    model = GPTConfig(
        vocab_size=256, block_size=64, n_layer=args.layers, n_head=4, n_embd=args.width
    )
    plan = Plan(model, MeshConfig(data=d, tensor=t, pipe=p), OptimConfig())
    coords = dict(zip(AXES, (int(i) for i in np.unravel_index(rank, (d, t, p))), strict=True))
    rng = np.random.default_rng(rank)
    block = Canonical(plan).zero_block()
    for x in block:
        x[...] = rng.standard_normal(x.shape) if x.dtype.kind == "f" else 1
    leaves = [jax.numpy.asarray(x) for x in block]
    shares = comm.gather(sum(x.nbytes for x in block), root=0)
    del block
    total = sum(
        np.prod(s.shape) * s.dtype.itemsize
        for s in jax.tree.leaves(Canonical(plan).global_shapes())
    )
    directory = os.path.join(args.dir, args.mode)
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
    comm.Barrier()
    way = (Sharded if args.mode == "sharded" else Gather)(comm, plan, coords, directory)

    rows = {"save": [], "restore": []}
    for step in range(1, args.repeats + 1):
        for op in ("save", "restore"):
            comm.Barrier()
            with PeakRss() as mem:
                t0 = time.perf_counter()
                result = way.save(step, leaves) if op == "save" else way.restore(step)
                seconds = time.perf_counter() - t0
            del result
            rows[op].append(comm.gather((seconds, mem.extra), root=0))
    if rank:
        return
    report = {
        "mode": args.mode,
        "ranks": size,
        "mesh": {"data": d, "tensor": t, "pipe": p},
        "model": {"n_layer": args.layers, "n_embd": args.width},
        "state_bytes": int(total),
        "share_bytes": [int(s) for s in shares],
    }
    mib = [round(s / 2**20, 1) for s in shares]
    print(f"{args.mode}: state {total / 2**20:.0f} MiB on {size} ranks, shares MiB {mib}")
    print(f"{'op':8} {'s (slowest rank, best repeat)':>30} {'peak extra MiB per rank (worst)':>40}")
    for op, repeats in rows.items():
        best = min(repeats, key=lambda r: max(s for s, _ in r))
        seconds = max(s for s, _ in best)
        peak = [max(r[i][1] for r in repeats) for i in range(size)]  # the worst repeat's
        extra = [round(e / 2**20, 1) for e in peak]
        ratio = [round(e / s, 3) for e, s in zip(peak, shares, strict=True)]
        report[op] = {
            "seconds": seconds,
            "seconds_per_repeat": [max(s for s, _ in r) for r in repeats],
            "peak_extra_bytes": [int(e) for e in peak],
            "peak_extra_over_share": ratio,
        }
        print(f"{op:8} {seconds:30.3f} {str(extra):>40}   x share {ratio}")
    write_json(args.out or f"bench/results/checkpoint_{args.mode}_np{size}.json", report)


if __name__ == "__main__":
    main()
