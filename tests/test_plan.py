"""The planner's models against what the compiled step holds and what the ledger records."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, batch
from _tiers import quick

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.state import Plan
from jaxhc.plan import amsp_bytes, data_collectives, state_bytes
from jaxhc.plan.cluster import local
from jaxhc.plan.cost import collectives
from jaxhc.plan.layout import Layout
from jaxhc.plan.shapes import from_gpt

EF = jaxhc.Policy.from_dict(
    {"name": "ef", "min_bytes": 0, "axes": {"data": {"codec": "zfp:8", "error_feedback": True}}}
)
CASES = [  # (data, tensor, pipe, shard, policy)
    (8, 1, 1, {}, "none"),
    (8, 1, 1, {"grads": 1, "optim": 4}, "none"),
    (8, 1, 1, {"grads": 2, "optim": 2, "groups": [2, 4]}, "none"),
    (4, 2, 1, {"optim": 1}, "none"),
    (2, 2, 2, {"grads": 1}, EF),
    (8, 1, 1, {"params": 2, "grads": 2, "optim": 8, "groups": [2]}, "none"),  # ZeRO-3 style
    (8, 1, 1, {"params": 2, "grads": 4, "optim": 4, "groups": [2, 4]}, EF),  # a residual a level
]


def _compiled_step(data, tensor, pipe, shard, policy):
    mesh_cfg = MeshConfig(data, tensor, pipe, 2, shard=shard)
    mesh = make_mesh(mesh_cfg, jax.devices()[: mesh_cfg.size])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, policy)
    return mesh_cfg, step, init_state(CFG, mesh_cfg, OPTIM, mesh, SEED, policy=policy)


# The quick suite: a plan of each kind (ZeRO-1 on groups, error feedback with tensor and pipe,
# sharded parameters with a residual a level); every case under `slow`.
@pytest.mark.parametrize("data, tensor, pipe, shard, policy", quick(CASES, {1, 4}))
def test_state_bytes_are_what_the_compiled_step_takes(data, tensor, pipe, shard, policy):
    """XLA's memory analysis of the compiled step, per device: its arguments are the state (P +
    OS, scalars and any residual included) and this device's token rows, to the byte."""
    mesh_cfg, step, state = _compiled_step(data, tensor, pipe, shard, policy)
    tokens = batch(0, size=16)
    analysis = step.lower(state, tokens).compile().memory_analysis()
    rows = tokens.nbytes // data
    want = state_bytes(CFG, mesh_cfg, policy)
    assert analysis.argument_size_in_bytes == want.state + rows
    held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state))
    assert held == want.state  # the state's arrays, one device's shards
    layout = Plan(CFG, mesh_cfg).layout
    assert want.grads == 4 * layout.padded // ShardPlan.of(mesh_cfg).grads


ZDATA = jaxhc.Policy.from_dict({"name": "zdata", "min_bytes": 0, "axes": {"data": "zfp:8"}})
MDATA = jaxhc.Policy.from_dict(
    {"name": "mdata", "min_bytes": 20000, "axes": {"data": "mpc", "data.0": "q8"}}
)


@pytest.mark.parametrize(
    "data, tensor, pipe, shard, policy",
    quick(
        [
            *CASES[:4],
            (8, 1, 1, {"grads": 1, "optim": 4}, ZDATA),
            (8, 1, 1, {"grads": 2, "optim": 2, "groups": [2, 4]}, ZDATA),
            (4, 2, 1, {"grads": 1, "optim": 2}, MDATA),  # messages under 20000 bytes go raw
            CASES[5],  # sharded parameters: gathered per layer, forward and again backward
            (
                8,
                1,
                1,
                {"params": 2, "grads": 2, "optim": 8, "groups": [2], "gather": "whole"},
                "none",
            ),
            # kept: the layers' parameters gathered in the forward only
            (
                8,
                1,
                1,
                {"params": 2, "grads": 2, "optim": 8, "groups": [2], "gather": "keep"},
                "none",
            ),
            (8, 1, 1, {"params": 2, "grads": 2, "optim": 8, "groups": [2, 4]}, ZDATA),
            (4, 2, 1, {"params": 4}, "none"),
        ],
        # the quick suite (CI time): per-level codecs beside tensor, and zfp on sharded
        # parameters gathered per layer over nested levels
        {6, 10},
    ),
)
def test_data_collective_bytes_are_the_ledgers(data, tensor, pipe, shard, policy):
    """Per data sub-axis and kind, the predicted raw bytes of one step are the ledger's, and so
    are the wire bytes the policy's codecs move."""
    mesh_cfg, step, state = _compiled_step(data, tensor, pipe, shard, policy)
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        state, m = step(state, batch(0, size=16))
        jax.block_until_ready(m)
    got = ledger.per_axis(devices=mesh_cfg.size, by_kind=True)
    raw, wire = defaultdict(float), defaultdict(float)
    fl = Plan(CFG, mesh_cfg, policy=policy).layout
    segments = (4 * fl.shared_padded, 4 * fl.layer_padded, fl.layers)
    for c in data_collectives(mesh_cfg, 4 * fl.padded, segments):
        raw[f"{c.axis}/{c.kind}"] += c.count * c.bytes
        wire[f"{c.axis}/{c.kind}"] += c.count * c.wire(policy)
    data_axes = ShardPlan.of(mesh_cfg).axes
    keys = [k for k in got if k.split("/")[0] in data_axes and not k.endswith("/other")]
    assert {k: got[k]["raw_bytes"] for k in keys} == pytest.approx(dict(raw), rel=1e-12)
    assert {k: got[k]["wire_bytes"] for k in keys} == pytest.approx(dict(wire), rel=1e-12)
    assert all(got[k]["fallbacks"] == 0 for k in keys)
    if mesh_cfg.shard.gather == "keep":  # the planner does not count keep (`check_layout`)
        return
    # the planner's cost model (jaxhc.plan.cost) predicts the same bytes per step
    p, g, o, levels = mesh_cfg.shard.resolve(data)
    lay = Layout(data, tensor, pipe, mesh_cfg.microbatches, p, g, o, levels)
    # MDATA's q8 (on data.0, with tensor 2) gives the flat layout blocks of 256 (`tensor_block`)
    codec = "q8" if policy is MDATA else "none"
    lay = dataclasses.replace(lay, gather=mesh_cfg.shard.gather, codec=codec)
    model = defaultdict(float)
    for c in collectives(from_gpt("tiny", CFG), lay, 16, CFG.block_size, local(mesh_cfg.size)):
        if c.axis in data_axes:
            model[f"{c.axis}/{c.kind}"] += c.count * c.raw
    assert {k: got[k]["raw_bytes"] for k in keys} == pytest.approx(dict(model), rel=1e-12)
    if policy is not ZDATA:
        return
    assert all(wire[k] < raw[k] / 3 for k in raw)  # zfp:8 on every data message


def test_amsp_counts_mixed_precision_as_the_paper():
    """2 psi / s_p + 2 psi / s_g + 12 psi / s_os (AMSP's Table 1)."""
    shard = ShardPlan.of(MeshConfig(data=8, shard={"optim": 4, "groups": [2, 4]}))
    got = amsp_bytes(1_000_000, shard)
    assert (got.params, got.grads, got.optim) == (2_000_000, 500_000, 3_000_000)


def test_state_bytes_scale_with_the_plan():
    """P stays, G and OS shrink with their group; a residual adds a padded vector."""
    base = MeshConfig(data=8)
    zero = state_bytes(CFG, base)
    ddp = state_bytes(CFG, dataclasses.replace(base, shard={"optim": 1}))
    assert zero.params == ddp.params
    assert ddp.grads == 8 * zero.grads
    assert ddp.optim - 8 == 8 * (zero.optim - 8)  # the two int32 scalars are not split
    fl = Plan(CFG, base).layout  # P is the tree (size), G and OS the padded vector
    want = (fl.size + (1 + 3) * fl.padded) / (fl.size + (1 + 3) * fl.padded / 8)
    assert np.isclose(ddp.total / zero.total, want, rtol=1e-3)
