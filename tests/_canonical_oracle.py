"""The oracle for checkpoint layouts: whole arrays through the trainer's own flat ZeRO layout.

`to_canonical` takes a train state in one mesh's layout (global host arrays) to the canonical
arrays of `jaxhc.parallel.canonical` (names and shapes no mesh enters); `from_canonical` puts them
into any mesh's layout. Written with `FlatLayout.flatten` / `unflatten` (what the train step uses)
and `partition.local_block`, on whole arrays: not with the checkpoint code's per-device boxes.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxhc import partition
from jaxhc.model.config import AXES
from jaxhc.parallel import TrainState
from jaxhc.parallel.canonical import Canonical
from jaxhc.parallel.state import Plan


def coords_of(m) -> list[dict]:
    """Every device's coordinates on the mesh of MeshConfig `m`, in rank order."""
    return [dict(zip(AXES, idx, strict=True)) for idx in np.ndindex(*m.shape)]


def _key(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def to_canonical(state: TrainState, plan: Plan) -> dict:
    m = plan.mesh_cfg
    shape = dict(zip(AXES, m.shape, strict=True))
    names = Canonical(plan).param_names
    params = jax.tree.leaves(state.params)
    specs = plan.layout.treedef.flatten_up_to(plan.param_specs)
    out = {"step": np.asarray(state.step)}
    out.update({f"params/{n}": np.asarray(x) for n, x in zip(names, params, strict=True)})
    for path, x in jax.tree.flatten_with_path(state.opt_state)[0]:
        key = _key(path)
        if x.ndim == 0:
            out[f"opt/{key}"] = np.asarray(x)
            continue
        ef = key == "residual"
        arrays = [np.zeros(((m.data,) if ef else ()) + p.shape, np.float32) for p in params]
        for c in coords_of(m):
            if not ef and c["data"]:
                continue
            vec = x[c["pipe"], c["tensor"]]
            vec = vec[c["data"] * plan.layout.padded :][: plan.layout.padded] if ef else vec
            local = plan.layout.treedef.flatten_up_to(plan.layout.unflatten(np.asarray(vec)))
            for arr, spec, block in zip(arrays, specs, local, strict=True):
                # a replicated parameter's values from its canonical copy (tensor and pipe rank
                # 0): another stage's copy of a shared embedding is stale
                if not partition.owns_block(spec, block.ndim, {**c, "data": 0}, shape):
                    continue
                box = partition.block_slices(spec, arr.shape[-block.ndim :], c, shape)
                (arr[c["data"]] if ef else arr)[box] = block
        prefix = "residual" if ef else f"opt/{key}"
        out.update({f"{prefix}/{n}": a for n, a in zip(names, arrays, strict=True)})
    return out


def from_canonical(canon: dict, plan: Plan) -> TrainState:
    m = plan.mesh_cfg
    shape = dict(zip(AXES, m.shape, strict=True))
    names = Canonical(plan).param_names
    specs = plan.layout.treedef.flatten_up_to(plan.param_specs)
    params = jax.tree.unflatten(plan.layout.treedef, [canon[f"params/{n}"] for n in names])

    def opt(path, x):
        key = _key(path)
        if x.ndim == 0:
            return np.asarray(canon[f"opt/{key}"], x.dtype)
        ef = key == "residual"
        prefix = "residual" if ef else f"opt/{key}"
        out = np.zeros((m.pipe, m.tensor, m.data * x.shape[0]), np.float32)
        for c in coords_of(m):
            full = [canon[f"{prefix}/{n}"] for n in names]
            full = [a[c["data"]] for a in full] if ef else full
            local = [
                partition.local_block(s, a, c, shape) for s, a in zip(specs, full, strict=True)
            ]
            vec = np.asarray(plan.layout.flatten(jax.tree.unflatten(plan.layout.treedef, local)))
            if ef:
                out[c["pipe"], c["tensor"], c["data"] * vec.size :][: vec.size] = vec
            else:
                out[c["pipe"], c["tensor"]] = vec
        return out

    opt_state = jax.tree.map_with_path(opt, plan.opt_local)
    return TrainState(np.asarray(canon["step"], np.int32), params, opt_state)


def on_mesh(state: TrainState, runner) -> TrainState:
    """A host state in the layout of `runner`'s plan, placed on its mesh (as an XlaRunner's)."""
    return jax.tree.map(
        lambda x, s: jax.device_put(x, NamedSharding(runner.mesh, s)),
        state,
        runner.plan.state_specs,
    )
