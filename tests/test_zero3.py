"""ZeRO-3 layer by layer (``mesh.shard.gather: layer``, the default for s_p > 1).

Each transformer layer's parameters are all-gathered over the parameter group just before the
layer runs, and again in the backward (the layer runs under a checkpoint that does not keep
them); the shared parameters (wte, wpe, ln_f) once a step. ``gather: whole`` gathers the whole
local vector once and keeps it through the backward. The oracle for the bits is ``whole`` (and
through tests/test_amsp.py, ZeRO); for the memory, XLA's own analysis of the compiled step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, batch
from _tiers import quick
from test_model_hlo import collectives_by_branching

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step
from jaxhc.parallel.layout import ROW
from jaxhc.parallel.state import Plan

DEEP = dataclasses.replace(CFG, n_layer=8)  # more layers: the gathered working set matters


def _mesh_cfg(gather, data=8, tensor=1, pipe=1, params=8):
    return MeshConfig(data, tensor, pipe, 2, shard={"params": params, "gather": gather})


@functools.cache
def _compiled(gather, model=DEEP):
    mesh_cfg = _mesh_cfg(gather)
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    step = make_train_step(model, mesh_cfg, OPTIM, mesh, "none")
    state = init_state(model, mesh_cfg, OPTIM, mesh, SEED)
    return step.lower(state, batch(0, model, size=16)).compile()


@pytest.mark.parametrize(
    "data, tensor, pipe", quick([(8, 1, 1), (4, 1, 2), (2, 2, 1)], {(4, 1, 2)})
)
def test_every_chunk_holds_each_layers_own_chunk(data, tensor, pipe):
    """The flat layout, on a tree whose every value is distinct: flatten and unflatten invert
    each other; any run of q whole pieces splits into the shared segment's and each layer's
    own q-piece chunk (`split`, inverted by `join`); `runs` names every stored element's
    parameter, padding left out, each row of ROW values holds one parameter, `rows` gives each
    row its parameter's flag, and `stored` tells the values from the padding."""
    mesh_cfg = MeshConfig(data, tensor, pipe)
    fl = Plan(CFG, mesh_cfg).layout
    leaves = [
        np.arange(np.prod(s), dtype=np.float32).reshape(s) + 1e4 * i
        for i, s in enumerate(fl.shapes)
    ]
    tree = fl.treedef.unflatten(leaves)
    vec = np.asarray(fl.flatten(tree))
    assert vec.shape == (fl.padded,) and fl.padded == data * fl.chunk
    for a, b in zip(jax.tree.leaves(fl.unflatten(vec)), leaves, strict=True):
        np.testing.assert_array_equal(a, b)
    segs = np.asarray(fl.layer_flat(tree["blocks"]))  # (layers, padded segment)
    shared = np.asarray(fl.shared_flat(tree))
    for q in {1, data // 2 or 1, data}:
        for j in range(data // q):
            got_shared, got_layers = fl.split(vec[j * q * fl.chunk : (j + 1) * q * fl.chunk])
            n, w = q * fl.shared_width, q * fl.layer_width
            np.testing.assert_array_equal(got_shared, shared[j * n : (j + 1) * n])
            np.testing.assert_array_equal(got_layers, segs[:, j * w : (j + 1) * w])
            np.testing.assert_array_equal(
                fl.join(got_shared, got_layers), vec[j * q * fl.chunk :][: q * fl.chunk]
            )
    owner = np.full(fl.padded, len(fl.shapes))  # the padding's index
    for at, leaf, offset, n in fl.runs(0, fl.padded):
        np.testing.assert_array_equal(
            vec[at : at + n], leaves[leaf].reshape(-1)[offset : offset + n]
        )
        owner[at : at + n] = leaf
    assert (owner < len(fl.shapes)).sum() == fl.size
    rows = owner.reshape(-1, ROW)  # a row of the layout holds one parameter (and padding)
    assert all(len(set(r[r < len(fl.shapes)])) <= 1 for r in rows)
    rng = np.random.default_rng(0)
    for flags in (rng.random(len(fl.shapes)) < 0.5, fl.decayed, np.ones(len(fl.shapes), bool)):
        expect = np.append(flags, False)[rows.min(axis=1)]  # padding rows: False
        for q in {1, data}:
            for j in range(data // q):
                lo, n = j * q * fl.chunk, q * fl.chunk
                got = fl.rows(flags, lo, n)
                np.testing.assert_array_equal(got, expect[lo // ROW : (lo + n) // ROW])
    for q in {1, data}:  # `stored`: the values `runs` names, padding (in a row too) left out
        for j in range(data // q):
            lo, n = j * q * fl.chunk, q * fl.chunk
            np.testing.assert_array_equal(fl.stored(lo, n), owner[lo : lo + n] < len(fl.shapes))
    assert [r for r in fl.runs(5, fl.padded - 3)] == [
        (max(at, 5), leaf, offset + max(0, 5 - at), min(at + n, fl.padded - 3) - max(at, 5))
        for at, leaf, offset, n in fl.runs(0, fl.padded)
        if at + n > 5 and at < fl.padded - 3
    ]


def test_gather_must_be_layer_whole_or_keep():
    message = r"mesh.shard.gather='layers' must be one of layer, whole, keep"
    with pytest.raises(ValueError, match=message):
        MeshConfig(8, shard={"params": 8, "gather": "layers"})


def test_per_layer_gathering_holds_less_than_the_whole_gathered_vector():
    """The compiled step's temporaries: ``whole`` keeps all L layers' gathered parameters from
    the forward to the backward (the model's autodiff residuals); per layer a device holds one
    layer's at a time (the forward's, then the backward's second gather), so it saves at least
    L - 1 gathered layers. The shared parameters are gathered once in both, and both hold the
    same activations and the same unreduced gradient."""
    layout = Plan(DEEP, _mesh_cfg("layer")).layout
    whole = _compiled("whole").memory_analysis()
    layer = _compiled("layer").memory_analysis()
    gathered_layer = 4 * layout.layer_padded  # float32 bytes of one gathered layer
    saved = whole.temp_size_in_bytes - layer.temp_size_in_bytes
    assert saved >= (layout.layers - 1) * gathered_layer, (whole, layer)
    assert layer.argument_size_in_bytes == whole.argument_size_in_bytes  # the same state


def test_the_backward_gathers_each_layer_again():
    """In the HLO, a layer's all-gather (its segment over "data") sits in the scan of each
    micro-batch's forward and of its backward: 2 x microbatches places, each run once per layer;
    ``whole`` has none (it gathers the whole vector once)."""
    layout = Plan(DEEP, _mesh_cfg("layer")).layout
    shape = f"f32[{layout.layer_padded}]"

    def layer_gathers(gather):
        found = collectives_by_branching(_compiled(gather).as_text())
        return [op for op, t, _ in found if op == "all-gather" and t.startswith(shape)]

    assert len(layer_gathers("layer")) == 2 * 2
    assert layer_gathers("whole") == []


@functools.cache
def _run(gather, tensor=1, pipe=1):
    data = 8 // (tensor * pipe)
    mesh_cfg = _mesh_cfg(gather, data, tensor, pipe, params=data)
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, "none")
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    ledger, losses = jaxhc.accounting.Ledger(), []
    for i in range(3):  # the first step's traffic
        with ledger if i == 0 else contextlib.nullcontext():
            state, m = step(state, batch(i, size=16))
            losses.append(np.float32(m["loss"]).view(np.uint32))
    got = ledger.per_axis(devices=8, by_kind=True)
    return np.array(losses), np.asarray(state.params), got, Plan(CFG, mesh_cfg).layout


# With tensor or pipe under `slow` (CI time): the quick suite's test_amsp checks per-layer ZeRO-3
# on data 4 with tensor 2 and with pipe 2 against ZeRO, bit for bit.
@pytest.mark.parametrize(
    "tensor, pipe",
    [
        (1, 1),
        pytest.param(1, 2, marks=pytest.mark.slow),
        pytest.param(2, 1, marks=pytest.mark.slow),
    ],
)
def test_per_layer_gathering_gives_the_bits_of_whole_gathering(tensor, pipe):
    """Under policy none: the same losses and parameter chunks, bit for bit (a layer's part of a
    chunk is the layer's own chunk; its gradient is summed over the micro-batches, then over the
    ranks, in the order of the whole vector's reduction)."""
    layer, whole = _run("layer", tensor, pipe), _run("whole", tensor, pipe)
    np.testing.assert_array_equal(layer[0], whole[0])
    np.testing.assert_array_equal(layer[1], whole[1])


@pytest.mark.parametrize(
    "tensor, pipe",
    [(1, 1), pytest.param(1, 2, marks=pytest.mark.slow)],  # CI time
)
def test_the_ledger_counts_each_gather_forward_and_backward(tensor, pipe):
    """Per device and step over a data axis of k ranks: the shared segment gathered once, each
    local layer's 2 x microbatches times ((k - 1) / k of its segment each: the forward and the
    backward's re-gather); ``whole`` gathers the vector once. The gradients move the same bytes
    either way (one reduce-scatter per segment instead of one of the vector)."""
    layer, whole = _run("layer", tensor, pipe), _run("whole", tensor, pipe)
    fl = layer[3]
    k = 8 // (tensor * pipe)
    part = (k - 1) / k * 4  # bytes a ring all-gather moves per gathered float32 value
    m = 2  # micro-batches
    gathered = fl.shared_padded + 2 * m * fl.layers * fl.layer_padded
    assert layer[2]["data/param"]["raw_bytes"] == pytest.approx(part * gathered, rel=1e-12)
    assert layer[2]["data/param"]["calls"] == 1 + 2 * m * fl.layers
    assert whole[2]["data/param"]["raw_bytes"] == pytest.approx(part * fl.padded, rel=1e-12)
    assert whole[2]["data/param"]["calls"] == 1
    assert layer[2]["data/grad"]["raw_bytes"] == pytest.approx(
        whole[2]["data/grad"]["raw_bytes"], rel=1e-12
    )
    assert layer[2]["data/grad"]["calls"] == 1 + fl.layers
