"""Orbax checkpoints of the sharded train state: atomic, verified, never replacing a good one."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


class Checkpoints:
    """Saves the train state every K steps (and at the end) under `<out>/checkpoints/<step>`.

    Orbax writes each checkpoint to a temporary directory and renames it into place only when it is
    complete, so an interrupted save never becomes "latest". A state with non-finite parameters is
    refused (the previous good checkpoint stays), and restore checks shapes and dtypes against the
    expected state before anything is used.
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
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()
        return True

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, like, step: int | None = None):
        """Restore into the shapes, dtypes and shardings of `like` (a state or abstract state).

        Leaves of `like` without a sharding (host numpy arrays, as under the MPI transport) are
        restored onto this process's default device, with the same shape checks.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"no checkpoint to resume from in {self.directory}")
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
                f"checkpoint {self.directory}/{step} does not match this run's state: "
                f"{str(e).splitlines()[0]}"
            ) from None

    def close(self) -> None:
        self._manager.close()
