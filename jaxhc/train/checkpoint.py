"""Orbax checkpoints of the sharded train state: atomic, verified, never replacing a good one."""

from __future__ import annotations

import hashlib
import json
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

MANIFEST = "jaxhc.sha256.json"  # in each step's directory: {relative path: [bytes, sha256]}


class Checkpoints:
    """Saves the train state every K steps (and at the end) under `<out>/checkpoints/<step>`.

    A save is complete in two stages, and a process killed at any point leaves the previous
    checkpoint the latest:

    1. Orbax writes the step into a temporary directory and renames it into place only when it is
       complete, so an interrupted write never appears as a step at all;
    2. jaxhc then records the size and SHA-256 of every file of the step in `MANIFEST` (written to
       a temporary file, synced and renamed). A step without it (killed between the two stages)
       is not a checkpoint: `latest_step` skips it and the next save of that step replaces it.

    `restore` checks every file against the manifest before Orbax reads it: a truncated or
    altered file is refused with one line naming it (and the newest intact step, if any); nothing
    is deleted or overwritten. Resuming from a corrupt checkpoint fails rather than silently
    falling back: the user decides (deleting the corrupt step resumes from the one before).

    A state with non-finite values is refused (the previous good checkpoint stays), and restore
    checks shapes and dtypes against the expected state before anything is used.
    """

    def __init__(self, directory: str, keep: int = 3):
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, step: int, state) -> bool:
        """Save `state` as `step`; return False (and save nothing) if it holds NaN/Inf."""
        checks = [
            jnp.isfinite(leaf).all()
            for leaf in jax.tree.leaves(state)
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        ]
        if not all(bool(c) for c in jax.device_get(checks)):
            return False
        if step in self._manager.all_steps():
            if self._complete(step):
                raise ValueError(f"checkpoint {self._path(step)} exists: it is not overwritten")
            self._manager.delete(step)  # an earlier save of this step, killed before its manifest
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()
        self._write_manifest(step)
        return True

    def latest_step(self) -> int | None:
        """The newest complete step (one whose manifest was written), or None."""
        return max(self.steps(), default=None)

    def steps(self) -> list[int]:
        """The complete steps, oldest first."""
        return sorted(s for s in self._manager.all_steps() if self._complete(s))

    def restore(self, like, step: int | None = None):
        """Restore into the shapes, dtypes and shardings of `like` (a state or abstract state).

        Every file is first checked against the step's manifest (ValueError naming the file).
        Leaves of `like` without a sharding (host numpy arrays, as under the MPI transport) are
        restored onto this process's default device, with the same shape checks.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"no checkpoint to resume from in {self.directory}")
        problem = self.verify(step)
        if problem is not None:
            older = next(
                (s for s in reversed(self.steps()) if s < step and not self.verify(s)), None
            )
            hint = (
                f"step {older} is the newest intact checkpoint: delete {self._path(step)} to "
                "resume from it"
                if older is not None
                else "no older intact checkpoint"
            )
            raise ValueError(f"{problem}; {hint}")
        local = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=getattr(a, "sharding", None) or local
            ),
            like,
        )
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # orbax raises many types; one clear line for the user
            raise ValueError(
                f"checkpoint {self._path(step)} does not match this run's state: "
                f"{str(e).splitlines()[0]}"
            ) from None

    def verify(self, step: int) -> str | None:
        """None if every file of `step` is as it was written; else what is wrong, naming a file."""
        root = self._path(step)
        try:
            with open(os.path.join(root, MANIFEST)) as f:
                recorded = json.load(f)
        except FileNotFoundError:
            return f"checkpoint {root} is incomplete (its save was interrupted)"
        except (OSError, ValueError) as e:
            return f"checkpoint file {os.path.join(root, MANIFEST)} is unreadable ({e})"
        found = _files(root)
        for rel in sorted(set(recorded) | set(found)):
            path = os.path.join(root, rel)
            if rel not in found:
                return f"checkpoint file {path} is missing"
            if rel not in recorded:
                return f"checkpoint file {path} was not part of the save"
            size, digest = recorded[rel]
            if os.path.getsize(path) != size:
                return (
                    f"checkpoint file {path} is corrupt: {os.path.getsize(path)} bytes, "
                    f"{size} when written"
                )
            if _sha256(path) != digest:
                return f"checkpoint file {path} is corrupt: its bytes differ from when written"
        return None

    def close(self) -> None:
        self._manager.close()

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _complete(self, step: int) -> bool:
        return os.path.exists(os.path.join(self._path(step), MANIFEST))

    def _write_manifest(self, step: int) -> None:
        root = self._path(step)
        recorded = {rel: [os.path.getsize(p), _sha256(p)] for rel, p in _files(root).items()}
        tmp = os.path.join(root, MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(recorded, f, indent=0, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, MANIFEST))


def _files(root: str) -> dict[str, str]:
    """Every file under `root` but the manifest (and its temporary): relative path -> path."""
    out = {}
    for parent, _, names in os.walk(root):
        for name in names:
            path = os.path.join(parent, name)
            rel = os.path.relpath(path, root)
            if rel not in (MANIFEST, MANIFEST + ".tmp"):
                out[rel] = path
    return out


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
