"""Helpers to run per-shard functions on simulated host-device meshes in tests."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# (mesh shape, axis names, the axis (or tuple) the collective runs over)
MESHES = {
    "1d2": ((2,), ("x",), "x"),
    "1d4": ((4,), ("x",), "x"),
    "1d8": ((8,), ("x",), "x"),
    "3d-tensor": ((2, 2, 2), ("data", "tensor", "pipe"), "tensor"),
    "3d-data-pipe": ((2, 2, 2), ("data", "tensor", "pipe"), ("data", "pipe")),
}


def mesh_of(name: str) -> tuple[Mesh, object]:
    shape, names, axis = MESHES[name]
    devices = np.array(jax.devices("cpu")[: int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, names), axis


def run(fn, mesh: Mesh, *args, check_vma: bool = True):
    """Run `fn` per shard with every argument split along its first dim over all mesh axes."""
    spec = P(tuple(mesh.axis_names))
    args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in args]
    mapped = jax.shard_map(
        fn, mesh=mesh, in_specs=(spec,) * len(args), out_specs=spec, check_vma=check_vma
    )
    return jax.jit(mapped)(*args)
