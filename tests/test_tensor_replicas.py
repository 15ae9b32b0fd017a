"""The tensor ranks' copies of the parameters "tensor" does not split (LayerNorms, row-parallel
biases, the embeddings) stay bit-identical under every data-axis codec: the flat ZeRO layout keeps
them out of the block codecs' blocks that hold split parameters (`FlatLayout` ``tensor_block``),
so every tensor rank codes and decodes the same values for them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, batch

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step
from jaxhc.parallel.layout import per_value
from jaxhc.parallel.state import Plan

MESH = MeshConfig(2, 2, 1, 1)  # data 2 x tensor 2
STEPS = 3


def _policy(data: dict) -> jaxhc.Policy:
    return jaxhc.Policy.from_dict({"name": "replicas", "axes": {"data": data}, "min_bytes": 0})


POLICIES = {
    "q8": {"codec": "q8"},
    "q4h-ef-keep_own": {"codec": "q4:h", "error_feedback": True, "keep_own": True, "param": "q8"},
    "q4-b1024h-ef": {"codec": "q4:b1024:h", "error_feedback": True, "param": "q4:b1024:h"},
    "zfp8": {"codec": "zfp:8"},  # blocks of 4 values: the plain layout
}
QUICK = ("q8",)  # the others under `slow` (CI time)


def _differing_params(params) -> list[str]:
    """The parameters whose copies on two devices (the same block of it) differ in some value."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        copies = {}
        for shard in leaf.addressable_shards:
            box = tuple((s.start, s.stop) for s in shard.index)
            copies.setdefault(box, []).append(np.asarray(shard.data))
        if any(not np.array_equal(c[0], o) for c in copies.values() for o in c[1:]):
            out.append(jax.tree_util.keystr(path))
    return out


def _differing_state(opt_state, plan: Plan) -> list[str]:
    """The optimizer-state vectors (moments, master copy, residuals) whose values of parameters
    "tensor" replicates differ between tensor ranks 0 and 1 (on some data rank)."""
    layout, shard = plan.layout, plan.shard
    replicated = ["tensor" not in axes for axes in layout.split_over]
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(opt_state))[0]:
        leaf = np.asarray(leaf)
        if leaf.ndim != 3:  # AdamW's count
            continue
        name = jax.tree_util.keystr(path)
        whole = name.endswith("['residual']")  # one padded vector per device (a single level)
        size = layout.padded if whole else layout.padded // shard.optim
        for d in range(MESH.data):
            start = 0 if whole else shard.optim_chunk(d)[0] * size
            mask = np.asarray(per_value(layout.rows(replicated, start, size)))
            t0, t1 = (leaf[0, t, d * size : (d + 1) * size][mask] for t in (0, 1))
            if not np.array_equal(t0, t1):
                out.append(f"{name} data rank {d}")
    return out


@pytest.mark.parametrize(
    "name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in POLICIES]
)
def test_tensor_replicas_stay_bit_identical(name):
    policy = _policy(POLICIES[name])
    mesh = make_mesh(MESH, jax.devices()[: MESH.size])
    step = make_train_step(CFG, MESH, OPTIM, mesh, policy)
    state = init_state(CFG, MESH, OPTIM, mesh, SEED, policy=policy)
    for i in range(STEPS):
        state, metrics = step(state, batch(i))
        assert np.isfinite(float(metrics["loss"]))  # one step in flight
    assert _differing_params(state.params) == []
    assert _differing_state(state.opt_state, Plan(CFG, MESH, OPTIM, policy)) == []
    if POLICIES[name].get("error_feedback"):
        assert np.asarray(state.opt_state["residual"]).any()


def test_only_block_codecs_with_tensor_change_the_layout():
    """A layout keeps split and replicated parameters apart only where it must (tensor > 1, a
    lossy block codec on data); blocks of 1024 make whole-block pieces too."""
    plain = Plan(CFG, MESH).layout
    assert Plan(CFG, MESH, OPTIM, _policy(POLICIES["zfp8"])).layout.layer_starts == (
        plain.layer_starts
    )
    untensored = MeshConfig(4, 1, 1, 1)
    assert (
        Plan(CFG, untensored, OPTIM, _policy(POLICIES["q8"])).layout.padded
        == Plan(CFG, untensored).layout.padded
    )
    for name, block in (("q8", 256), ("q4-b1024h-ef", 1024)):
        layout = Plan(CFG, MESH, OPTIM, _policy(POLICIES[name])).layout
        assert layout.layer_starts != plain.layer_starts and layout.layer_width % block == 0
        split = ["tensor" in layout.split_over[i] for i in layout.block_leaves]
        for i in range(1, len(split)):
            if split[i] != split[i - 1]:
                assert layout.layer_starts[i] % block == 0, (name, i)
