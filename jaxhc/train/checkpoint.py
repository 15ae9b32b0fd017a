"""Sharded checkpoints: every process writes its own pieces of the canonical arrays, no gather.

A checkpoint of step s is the directory ``<directory>/<s>``: one zarr array (tensorstore, file
store, uncompressed) per canonical array of `jaxhc.parallel.canonical` (global shapes that no mesh
enters) and ``meta.json`` (the format, the step, the writing mesh, every array's shape and dtype,
the scalars). Each process writes the boxes its devices own (one device per box), so a process
holds nothing beyond its own blocks; storage chunks never span two devices' blocks but for the
flat optimizer vectors at ZeRO chunk boundaries, where tensorstore's file locking makes the
read-modify-write of the shared chunk safe. Any mesh reads any checkpoint: a device reads the
boxes of its own block.

Atomic: everything is written into ``<directory>/.tmp-<s>``; after every process has written (a
barrier), process 0 writes ``meta.json`` last and renames the directory to ``<s>``, so a
half-written checkpoint is never listed (a process killed at any point of a save leaves the
previous checkpoint the latest; the next save removes the debris).

Verified: ``meta.json`` records the size and SHA-256 of every file of the step (each process
hashes a share of them after the barrier) and a digest of itself. `restore` checks every file
first (again shared among the processes): a truncated, altered, missing or extra file is refused
in one line naming it and the newest intact step before it; nothing is deleted or overwritten, and
resuming never falls back silently to an older step (the user decides).

A state that holds NaN/Inf on any process is refused by all of them (nothing is written, the
previous checkpoint stays). The directory must be one that every process sees (a shared file
system): process 0 writes a token there first and every process checks that it reads it back,
refusing in one line otherwise.

The files of a step and their checks: `jaxhc.train.checkpoint_files`; reading a step back (its
checks against the run, residuals onto another data size): `jaxhc.train.checkpoint_restore`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from jaxhc import partition
from jaxhc.parallel.canonical import Canonical, extract
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint_files import (
    FORMAT,
    META,
    TOKEN,
    Arrays,
    Group,
    damage,
    digest,
    hash_share,
    kvstore,
)
from jaxhc.train.checkpoint_restore import (
    Corrupt,
    check_matches,
    read_blocks,
    read_meta,
    residual_rule,
)

__all__ = ["META", "Checkpoints", "Group", "all_finite"]


def all_finite(tree) -> bool:
    """Whether every floating-point value of `tree` that this process holds is finite.

    Each device's shard is checked on that device alone: a check of the global arrays would be a
    program with cross-device reductions, and launched right after a train step such programs
    hung XLA:CPU's collective rendezvous now and then (40 s, then an abort) with 8 simulated
    devices on 2 busy cores. A shard in host memory (a CPU device's) is read in place by numpy:
    a program per shard shape and device would be compiled for nothing (on XLA:CPU those compiles
    took a quarter of a one-step tiny training run). `Checkpoints.save` combines the processes'
    answers."""
    checks = []
    for leaf in jax.tree.leaves(tree):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            continue
        shards = getattr(leaf, "addressable_shards", None)
        for data in [s.data for s in shards] if shards else [leaf]:
            host = not isinstance(data, jax.Array) or next(iter(data.devices())).platform == "cpu"
            checks.append(np.isfinite(np.asarray(data)).all() if host else jnp.isfinite(data).all())
    return all(bool(c) for c in jax.device_get(checks))


class Checkpoints:
    """Saves train states under ``<directory>/<step>`` and restores them onto any mesh.

    Every process of a run makes one (with the same `group`) and calls `save` and `restore`
    together; blocks are ``(coords, leaves)``: a device's mesh coordinates ({"data": d, "tensor":
    t, "pipe": p}) and its block of the TrainState (`jax.tree.leaves` order, host arrays).
    """

    def __init__(self, directory: str, keep: int = 3, group: Group | None = None):
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.group = group or Group()
        self._context = ts.Context()

    # --- listing -------------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The committed checkpoints' steps, oldest first."""
        return sorted(
            int(n)
            for n in _listdir(self.directory)
            if n.isdigit() and os.path.exists(os.path.join(self.directory, n, META))
        )

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # --- save ----------------------------------------------------------------------------------

    def save(self, step: int, plan: Plan, blocks: Iterable, finite: bool = True) -> bool:
        """Save this process's `blocks` of the state as `step`; every process passes whether its
        blocks are finite (`all_finite`), and if any is not, nothing is saved and all return
        False."""
        group = self.group
        if not group.all_true(finite):
            return False
        canon = Canonical(plan)
        tmp = os.path.join(self.directory, f".tmp-{step}")
        token, error = None, None
        if group.rank == 0:
            try:
                token = self._prepare(tmp, canon)
            except OSError as e:
                error = f"cannot create {tmp}: {e}"
        self._raise_if_any(step, error)
        token = group.bcast(token)
        scalars: dict = {}
        try:
            self._check_shared(tmp, token)
            self._write(tmp, canon, blocks, scalars)
        except (OSError, ValueError) as e:
            error = str(e).splitlines()[0]
        self._raise_if_any(step, error)
        scalars = {k: v for share in group.all_gather(scalars) for k, v in share.items()}
        try:
            hashed = hash_share(tmp, group)
        except OSError as e:
            hashed, error = {}, f"cannot read back {tmp}: {e}"
        self._raise_if_any(step, error)
        files = {k: v for share in group.all_gather(hashed) for k, v in share.items()}
        if group.rank == 0:
            try:
                self._commit(tmp, step, canon, scalars, files)
            except (OSError, KeyError) as e:
                error = f"cannot commit {tmp}: {e}"
        self._raise_if_any(step, error)  # also the barrier after which the checkpoint is listed
        return True

    def _raise_if_any(self, step: int, error: str | None) -> None:
        error = self.group.first_error(error)
        if error:
            raise OSError(f"checkpoint of step {step} in {self.directory} failed: {error}")

    def _prepare(self, tmp: str, canon: Canonical) -> str:
        """Process 0: an empty temporary directory with the (empty) arrays and a fresh token."""
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        token = uuid.uuid4().hex
        with open(os.path.join(tmp, TOKEN), "w") as f:
            f.write(token)
        futures = []
        for name, a in canon.arrays.items():
            if a.shape:
                metadata = {
                    "shape": list(a.shape),
                    "chunks": list(a.chunks),
                    "dtype": a.dtype.str,
                    "compressor": None,
                }
                spec = {"driver": "zarr", "kvstore": kvstore(tmp, name), "metadata": metadata}
                futures.append(ts.open(spec, create=True, context=self._context))
        for f in futures:
            f.result()
        return token

    def _check_shared(self, tmp: str, token: str) -> None:
        try:
            with open(os.path.join(tmp, TOKEN)) as f:
                seen = f.read()
        except OSError:
            seen = None
        if seen != token:
            raise ValueError(
                f"{self.directory} is not shared: {socket.gethostname()} does not see what "
                "process 0 wrote there; checkpoints need a file system every process sees "
                "(docs/training.md: Checkpoints)"
            )

    def _write(self, tmp: str, canon: Canonical, blocks, scalars: dict) -> None:
        """Write the owned pieces, one leaf at a time: a leaf is brought to the host (if it is
        on a device) and its writes finish before the next leaf's start."""
        arrays = Arrays(tmp, self._context)
        for coords, leaves in blocks:
            pieces = [p for p in canon.pieces(coords) if p.owner]
            for leaf in sorted({p.leaf for p in pieces}):
                host = np.asarray(leaves[leaf])
                futures = []
                for piece in (p for p in pieces if p.leaf == leaf):
                    if not piece.box:
                        scalars[piece.name] = host.item()
                        continue
                    futures.append(arrays[piece.name][piece.box].write(extract(piece, host)))
                for f in futures:
                    f.result()

    def _commit(self, tmp: str, step: int, canon: Canonical, scalars: dict, files: dict) -> None:
        """Process 0: meta.json last, then the atomic rename; older checkpoints pruned."""
        meta = {
            "format": FORMAT,
            "step": step,
            "mesh": canon.mesh_shape,
            "residual_levels": canon.residual_levels,
            "arrays": {
                n: {"shape": list(a.shape), "dtype": a.dtype.str} for n, a in canon.arrays.items()
            },
            "scalars": {n: scalars[n] for n, a in canon.arrays.items() if not a.shape},
            "files": dict(sorted(files.items())),
        }
        meta["digest"] = digest(meta)
        os.remove(os.path.join(tmp, TOKEN))
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        final = os.path.join(self.directory, str(step))
        old = os.path.join(self.directory, f".old-{step}")
        if os.path.exists(final):  # the same step saved again (a resumed run): replace it
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        for s in self.steps()[: -self.keep]:
            shutil.rmtree(os.path.join(self.directory, str(s)), ignore_errors=True)
        for n in os.listdir(self.directory):  # what interrupted saves left behind
            if n.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.directory, n), ignore_errors=True)

    # --- restore -------------------------------------------------------------------------------

    def restore(self, plan: Plan, coords: Iterable[dict], step: int | None = None) -> Iterator:
        """The blocks ``(coords, leaves)`` of the devices at `coords` on the mesh of `plan`, from
        the checkpoint of `step` (default: the latest), whatever mesh wrote it.

        Parameters, optimizer moments and master copy are exact. Error-feedback residuals are
        exact when "data" has the size it had; otherwise each element's residuals (what the data
        ranks had not yet delivered of it) are summed and spread evenly over the new data ranks,
        which keeps their total, with a logged warning. Checks run before the first block is made:
        a missing checkpoint or one of another model is a ValueError naming the array.
        """
        step, meta = self._verified(step)
        canon = Canonical(plan)
        path = self._path(step)
        check_matches(path, canon, meta["arrays"])
        spread = residual_rule(path, canon, meta)
        return read_blocks(Arrays(path, self._context), canon, meta, coords, spread)

    def _resolve(self, step: int | None) -> int:
        step = self.latest_step() if step is None else step
        if step is None:
            old = ""
            if any(n.isdigit() for n in _listdir(self.directory)):
                old = (
                    " (its step directories are in another format: checkpoints written before "
                    "jaxhc's sharded checkpoints do not load)"
                )
            raise ValueError(f"no checkpoint to resume from in {self.directory}{old}")
        return step

    def _meta(self, step):
        step = self._resolve(step)
        return step, read_meta(self.directory, step)

    def _verified(self, step: int | None) -> tuple[int, dict]:
        """(step, meta.json) of checkpoint `step` (default: the latest), every file of it checked
        first: a ValueError naming what is wrong and where to resume from instead."""
        step = self._resolve(step)
        problem = self.verify(step)
        if problem is not None:
            raise ValueError(f"{problem}; {self._hint(step)}")
        return self._meta(step)

    def verify(self, step: int) -> str | None:
        """None if every file of checkpoint `step` is as it was written; else what is wrong (one
        line naming the file). Every process of the group calls it; each reads a share."""
        try:
            _, meta = self._meta(step)
        except Corrupt as e:
            return str(e)
        return self.group.first_error(damage(self._path(step), meta, self.group))

    def _hint(self, step: int) -> str:
        """Where a user whose checkpoint `step` is damaged can resume from."""
        for s in reversed(self.steps()):
            if s < step and self.verify(s) is None:
                return (
                    f"step {s} is the newest intact checkpoint: delete {self._path(step)} to "
                    "resume from it"
                )
        return "no older intact checkpoint"

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def read_arrays(self, prefix: str, step: int | None = None) -> tuple[int, dict]:
        """(step, {name: array}) of the whole canonical arrays whose names start with `prefix`
        (``"params/"``: the model in its single layout, whatever mesh wrote it) of checkpoint
        `step` (default: the latest), its files verified first: what tools that need the model
        alone read (`jaxhc generate`, `eval`, `export`)."""
        step, meta = self._verified(step)
        arrays = Arrays(self._path(step), self._context)
        names = [n for n in meta["arrays"] if n.startswith(prefix)]
        return step, {n: arrays[n].read().result() for n in names}

    def read_global(self, plan: Plan, step: int | None = None):
        """The checkpoint as a TrainState of global host arrays in the layout of `plan`'s mesh
        (every device's block assembled in this process: for inspection and tests)."""
        canon = Canonical(plan)
        mesh = canon.mesh_shape
        all_coords = [dict(zip(mesh, idx, strict=True)) for idx in np.ndindex(*mesh.values())]
        blocks = [leaves for _, leaves in self.restore(plan, all_coords, step)]
        specs = jax.tree.leaves(plan.state_specs, is_leaf=partition.is_spec)
        leaves = [
            partition.assemble(spec, [b[i] for b in blocks], all_coords, mesh)
            for i, spec in enumerate(specs)
        ]
        return canon.unflatten(leaves)


def _listdir(directory: str) -> list[str]:
    return os.listdir(directory) if os.path.isdir(directory) else []
