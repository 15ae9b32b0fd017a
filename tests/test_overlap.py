"""The train step's gradients reduced layer by layer in the backward (``overlap``): the same bits as
the whole vector reduced after it, the reductions inside the backward's layer scan, and the
configurations where the step keeps the reduction after the backward."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, all_axes, batch

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step, params_to_single
from jaxhc.parallel.grads import overlaps
from jaxhc.parallel.state import Plan

DDP = {"params": 1, "grads": 1, "optim": 1}


def _run(mesh_cfg, policy, overlap, steps=2):
    mesh = make_mesh(mesh_cfg, jax.devices()[: mesh_cfg.size])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, policy, overlap=overlap)
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED, policy=policy)
    metrics = []
    for i in range(steps):
        state, m = step(state, batch(i))
        metrics.append({k: np.asarray(v) for k, v in m.items()})
    return metrics, params_to_single(state), step.lower(state, batch(0)).compile().as_text()


@pytest.mark.parametrize(
    "mesh_cfg, policy",
    [
        (MeshConfig(2, 2, 2), all_axes("q8", "q8-all")),
        pytest.param(MeshConfig(4, 2, 1), all_axes("zfp:8", "zfp8-all"), marks=pytest.mark.slow),
        pytest.param(
            MeshConfig(8, shard=DDP), all_axes("zfp:8:d3", "zfp8d3-all"), marks=pytest.mark.slow
        ),
    ],
    ids=["zero1-2x2x2-q8", "zero1-4x2x1-zfp8", "ddp-8-zfp8d3"],
)
def test_overlapped_reduction_gives_the_same_bits(mesh_cfg, policy):
    """Losses, gradient norms and parameters bit for bit with and without overlap (every message
    compressed: a layer's segment is sent with the codec the whole vector gets, though it is
    under the policy's min_bytes on its own), and with it the gradients' reduce-scatters sit
    inside the backward's layer scan (a while loop), one per layer, not after it."""
    on, on_params, hlo = _run(mesh_cfg, policy, True)
    off, off_params, hlo_off = _run(mesh_cfg, policy, False)
    for a, b in zip(on, off, strict=True):
        for k in ("loss", "grad_norm"):
            assert a[k].tobytes() == b[k].tobytes(), k
    for a, b in zip(jax.tree.leaves(on_params), jax.tree.leaves(off_params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert _in_loops(hlo, "all-to-all(") > _in_loops(hlo_off, "all-to-all(")


def _in_loops(hlo: str, op: str) -> int:
    """How many `op` instructions the while loops' bodies hold, with what they call."""
    comps = {}
    for block in re.split(r"\n(?=\S)", hlo):
        m = re.match(r"(?:ENTRY )?%(\S+) ", block)
        if m:
            comps[m.group(1)] = block
    todo = re.findall(r"body=%([\w.\-]+)", hlo)
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo += [c for c in re.findall(r"%([\w.\-]+)", comps[name]) if c in comps]
    return sum(comps[n].count(op) for n in seen)


def test_the_step_keeps_the_reduction_after_the_backward_where_it_must():
    """Sharded parameters, several micro-batches, error feedback, fidelity sampling, and a codec
    whose coding of a value depends on its place in the message (random rounding keyed by the
    index) keep the whole vector's reduction after the backward."""
    zfp = {("data", "scatter"): jaxhc.codecs.parse("zfp:8")}
    plain = Plan(CFG, MeshConfig(4))
    assert overlaps(plain, 0, zfp)
    assert not overlaps(Plan(CFG, MeshConfig(4, microbatches=2)), 0, zfp)
    assert not overlaps(Plan(CFG, MeshConfig(4, shard={"params": 4, "grads": 4, "optim": 4})))
    assert not overlaps(plain, 2, zfp)
    assert not overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("q8:sr")})
    assert not overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("q8:b1024")})
    assert overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("mpc")})
    feedback = jaxhc.Policy.preset("zhybrid_ef")
    assert not overlaps(Plan(CFG, MeshConfig(4), OPTIM, feedback), 0, zfp)
