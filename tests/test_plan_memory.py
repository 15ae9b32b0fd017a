"""The planner's float32 state per device (`jaxhc.plan.cost.memory`, as `search.evaluate` counts
a row) is the runtime's count of the same plan (`jaxhc.plan.state_bytes`, which
tests/test_plan.py checks against XLA to the byte), and its flat vector the runtime layout's:
over meshes, shard plans and the policies the plans run, tensor 2 with a block codec on data
(the layout's tensor blocks), error feedback (a residual per level) and sharded parameters
among them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _gpt import CFG

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel.state import Plan
from jaxhc.plan import cluster as clusters
from jaxhc.plan import state_bytes
from jaxhc.plan.cost import codec_by_policy, spec_policy
from jaxhc.plan.layout import Layout, device_params, device_segments, trainable
from jaxhc.plan.search import evaluate
from jaxhc.plan.shapes import from_gpt

SHAPE = from_gpt("tiny", CFG)
POLICIES = Path(__file__).resolve().parent.parent / "configs" / "policy"
SPECS = ("q8", "q4:h", "mpc", "zfp:8:d3", "zfp:16:d3")  # the codecs the cases' policies send
CLUSTER = clusters.from_dict(  # 2 devices a node: every data level of 2 ranks or more crosses
    {
        "name": "pairs",
        "nodes": 4,
        "devices_per_node": 2,
        "memory_gib": 1,
        "links": {
            "intra": {"gbit_s": 800, "latency_us": 2},
            "inter": {"gbit_s": 80, "latency_us": 10},
        },
        "codecs": {c: {"encode_gb_s": 20, "decode_gb_s": 10} for c in SPECS},
    }
)
CASES = [  # (data, tensor, pipe, shard, policy file or codec on the data levels that cross)
    (8, 1, 1, {}, "none"),
    (4, 2, 1, {"grads": 2, "optim": 2, "groups": [2]}, "q8"),  # tensor blocks of 256
    (4, 2, 1, {"params": 2, "grads": 2, "optim": 4, "groups": [2]}, "q8_ef.yaml"),
    (2, 2, 2, {"params": 2}, "q4_ef.yaml"),  # q4 (rotated) grads, q8 params, residuals
    (2, 4, 1, {"optim": 1}, "q4:h"),
    (8, 1, 1, {"params": 2, "grads": 4, "optim": 4, "groups": [2, 4]}, "zhybrid_ef.yaml"),
    (4, 2, 1, {"params": 4, "gather": "whole"}, "mzhybrid_ef.yaml"),
]


def _row(data, tensor, pipe, shard, policy):
    """(the runtime's mesh and policy, the planner's row) of one plan."""
    mesh = MeshConfig(data, tensor, pipe, 1, shard=shard)
    p, g, o, levels = mesh.shard.resolve(data)
    gather = mesh.shard.gather
    if policy.endswith(".yaml"):
        path = str(POLICIES / policy)
        lay = Layout(data, tensor, pipe, 1, p, g, o, levels, f"policy {path}", gather=gather)
        row = evaluate(SHAPE, lay, CLUSTER, 64, 16, codec_by_policy(path))
        return mesh, jaxhc.Policy.load(path), row
    lay = Layout(data, tensor, pipe, 1, p, g, o, levels, policy, gather=gather)
    run = spec_policy(policy, lay, CLUSTER)  # what `jaxhc plan --write` gives the run
    run = None if run is None else jaxhc.Policy.from_dict(run)
    return mesh, run, evaluate(SHAPE, lay, CLUSTER, 64, 16)


@pytest.mark.parametrize("data, tensor, pipe, shard, policy", CASES)
def test_planner_state_is_the_runtimes(data, tensor, pipe, shard, policy):
    mesh, run, row = _row(data, tensor, pipe, shard, policy)
    assert not row.rejected and row.trainable == "yes"
    want = state_bytes(CFG, mesh, run)
    got = row.memory
    assert (got.params, got.grads, got.optim) == (want.params, want.grads, want.optim)
    fl = Plan(CFG, mesh, policy=run).layout
    assert device_params(SHAPE, row.layout) == (fl.size, fl.padded)
    segments = (fl.shared_padded, fl.layer_padded, fl.layers)
    assert device_segments(SHAPE, row.layout) == segments


def test_a_block_codec_on_data_with_tensor_2_shapes_the_count():
    """The tensor blocks of q8 (256 values) move parameters apart: the planner counts the
    layout the run gets, not the plain one."""
    mesh, run, row = _row(*CASES[1])
    assert Plan(CFG, mesh, policy=run).layout.padded != Plan(CFG, mesh).layout.padded
    assert row.memory.optim == state_bytes(CFG, mesh, run).optim != state_bytes(CFG, mesh).optim


@pytest.mark.parametrize("precision", ["float32", "mixed"])
@pytest.mark.parametrize("data, tensor, pipe", [(1, 1, 1), (8, 1, 1), (64, 2, 4), (1024, 8, 2)])
def test_a_shape_only_vector_is_its_segments(data, tensor, pipe, precision):
    """A model known by its shapes (or counted in mixed precision): the padded vector is its
    segments', each padded by the runtime layout's rule (`segment_padded`): the shared segment
    holds the device's shared parameters and every layer its share; and without a tensor or
    pipe split, where the shape count is the runtime's but for the final norm and the rows a
    parameter starts on, the segments are the runtime layout's up to one padding quantum."""
    import dataclasses

    from jaxhc.parallel.layout import ALIGN, ROW
    from jaxhc.plan.presets import load_shape

    for name in ("gpt2-small", "llama-7b"):
        shape = dataclasses.replace(load_shape(name), gpt=None)
        lay = Layout(data, tensor, pipe, 1, 1, data, data, (data,), precision=precision)
        size, padded = device_params(shape, lay)
        shared, one, layers = device_segments(shape, lay)
        q = ALIGN * data
        assert shared % q == 0 and one % q == 0 and shared + layers * one == padded
        assert one >= -(-shape.layer_params() // tensor) and shared + layers * one >= size
        assert shared >= size - layers * -(-shape.layer_params() // tensor) >= 0
        if tensor == pipe == 1 and data <= 8:
            fl = Plan(load_shape(name).gpt, MeshConfig(data)).layout
            rows = ROW * 16  # a parameter's last row, for the up to 16 parameters of a segment
            norm = shape.shared_params()["ln_f"]  # not in the shape count
            assert 0 <= fl.shared_padded - shared <= q + rows + norm
            assert 0 <= fl.layer_padded - one <= q + rows


def test_a_plan_of_one_data_rank_is_trainable():
    """A tensor x pipe plan without data parallelism: the mesh its plan file writes (no
    nested groups: ``groups: []``) is one the trainer takes."""
    lay = Layout(1, 2, 2, 2, 1, 1, 1, (1,))
    assert trainable(SHAPE, lay) == "yes"
    assert MeshConfig(**lay.mesh_overrides()).shard.resolve(1) == (1, 1, 1, (1,))


PRESETS = sorted(POLICIES.glob("*.yaml"))
NESTED = [  # (data, tensor, pipe, groups): ZeRO-1 over nested data levels
    (8, 1, 1, [2, 4]),
    (4, 2, 1, [2]),
    (2, 2, 2, None),
]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_the_planners_flat_layout_is_the_runs_under_every_preset(path):
    """The codec blocks that shape the flat layout (`FlatLayout.align`, the tensor blocks) are
    the largest lossy block of every data level's codecs (`jaxhc.Policy.data_codecs`), wherever
    the level: the planner, which asks the same function of the same policy, gets the run's
    layout on nested data groups too."""
    policy = jaxhc.Policy.load(str(path))
    for data, tensor, pipe, groups in NESTED:
        mesh = MeshConfig(data, tensor, pipe, 1, shard={"groups": groups or []})
        p, g, o, levels = mesh.shard.resolve(data)
        lay = Layout(data, tensor, pipe, 1, p, g, o, levels, f"policy {path}")
        fl = Plan(CFG, mesh, policy=policy).layout
        assert device_params(SHAPE, lay) == (fl.size, fl.padded)
        assert device_segments(SHAPE, lay) == (fl.shared_padded, fl.layer_padded, fl.layers)


def test_a_codec_spec_gets_the_runs_layout_on_every_plan_searched():
    """A codec spec goes on the data levels that cross nodes only (`spec_policy`, what the run
    gets): on a cluster of 4-device nodes the inner levels of many plans keep no codec. Every
    plan the search prices with a codec still counts the run's flat layout."""
    from jaxhc.plan.search import search

    quads = dataclasses.replace(CLUSTER, devices_per_node=4, nodes=2)
    seen = set()
    for row in search(
        SHAPE, quads, 64, 16, codecs=("none", "q8", "zfp:8:d3"), model_parallel="all"
    ):
        lay = row.layout
        key = (lay.data, lay.tensor, lay.pipe, lay.levels, lay.sizes, lay.codec)
        if lay.codec == "none" or row.rejected.startswith("invalid") or key in seen:
            continue
        seen.add(key)
        run = spec_policy(lay.codec, lay, quads)
        mesh = MeshConfig(**lay.mesh_overrides())
        fl = Plan(CFG, mesh, policy=run and jaxhc.Policy.from_dict(run)).layout
        assert device_params(SHAPE, lay) == (fl.size, fl.padded), key
        assert device_segments(SHAPE, lay) == (fl.shared_padded, fl.layer_padded, fl.layers)
    assert any(len(k[3]) > 1 and k[3][0] * k[1] * k[2] <= 4 for k in seen)  # an inner level
