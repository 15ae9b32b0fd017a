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


def _run(mesh_cfg, policy, overlap, steps=2, state=False):
    """(metrics, the parameters (`state`: the whole train state), the compiled step's HLO)."""
    mesh = make_mesh(mesh_cfg, jax.devices()[: mesh_cfg.size])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, policy, overlap=overlap)
    s = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED, policy=policy)
    metrics = []
    for i in range(steps):
        s, m = step(s, batch(i))
        metrics.append({k: np.asarray(v) for k, v in m.items()})
    hlo = step.lower(s, batch(0)).compile().as_text()
    return metrics, (jax.device_get(s) if state else params_to_single(s)), hlo


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


_EF = {"codec": "q4:h", "error_feedback": True}


def _feedback(name, **axes) -> jaxhc.Policy:
    """Error feedback on "data" (every message compressed), `axes` on the others."""
    return jaxhc.Policy.from_dict({"name": name, "axes": {"data": _EF, **axes}, "min_bytes": 0})


@pytest.mark.parametrize(
    "mesh_cfg, policy",
    [
        pytest.param(  # CI time: the quick suite overlaps q8 above
            MeshConfig(2, 2, 2), _feedback("q4ef", tensor="mpc", pipe="mpc"), marks=pytest.mark.slow
        ),
        pytest.param(MeshConfig(4, shard=DDP), _feedback("q4ef-ddp"), marks=pytest.mark.slow),
        pytest.param(  # blocks of 1024 values: the layout's pieces are whole blocks of them
            MeshConfig(4),
            jaxhc.Policy.from_dict(
                {"name": "q4-1024", "axes": {"data": {**_EF, "codec": "q4:b1024:h"}}}
            ),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["zero1-2x2x2-q4h-ef", "ddp-4-q4h-ef", "zero1-4-q4b1024h-ef"],
)
def test_overlapped_reduction_with_error_feedback_gives_the_same_bits(mesh_cfg, policy):
    """With error-feedback residuals each layer's reduction takes its part of the residual and
    gives its new one: losses, gradient norms, parameters and residuals bit for bit with and
    without overlap, the reduce-scatters inside the backward's layer scan."""
    on, on_state, hlo = _run(mesh_cfg, policy, True, state=True)
    off, off_state, hlo_off = _run(mesh_cfg, policy, False, state=True)
    for a, b in zip(on, off, strict=True):
        for k in ("loss", "grad_norm"):
            assert a[k].tobytes() == b[k].tobytes(), k
    assert np.asarray(on_state.opt_state["residual"]).any()
    for a, b in zip(jax.tree.leaves(on_state), jax.tree.leaves(off_state), strict=True):
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
    """Sharded parameters, several micro-batches, error feedback with ``keep_own``, fidelity
    sampling, and a codec whose coding of a value depends on its place in the message (random
    rounding keyed by the index) keep the whole vector's reduction after the backward."""
    zfp = {("data", "scatter"): jaxhc.codecs.parse("zfp:8")}
    plain = Plan(CFG, MeshConfig(4))
    assert overlaps(plain, 0, zfp)
    assert not overlaps(Plan(CFG, MeshConfig(4, microbatches=2)), 0, zfp)
    assert not overlaps(Plan(CFG, MeshConfig(4, shard={"params": 4, "grads": 4, "optim": 4})))
    assert not overlaps(plain, 2, zfp)
    assert not overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("q8:sr")})
    assert not overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("q8:b1024")})
    q8_1024 = jaxhc.Policy.from_dict({"name": "q8-1024", "axes": {"data": "q8:b1024"}})
    with jaxhc.context.use(policy=q8_1024):  # a layout of whole blocks of 1024 values
        b1024 = {("data", "scatter"): jaxhc.codecs.parse("q8:b1024")}
        assert overlaps(Plan(CFG, MeshConfig(4), OPTIM, q8_1024), 0, b1024)
    assert overlaps(plain, 0, {("data", "scatter"): jaxhc.codecs.parse("mpc")})
    keep_own = jaxhc.Policy.from_dict(
        {"name": "own", "axes": {"data": {**_EF, "keep_own": True}}, "min_bytes": 0}
    )
    with jaxhc.context.use(policy=keep_own):
        assert not overlaps(Plan(CFG, MeshConfig(4), OPTIM, keep_own), 0, zfp)
    feedback = jaxhc.Policy.preset("zhybrid_ef")  # error feedback alone overlaps
    with jaxhc.context.use(policy=feedback):
        assert overlaps(Plan(CFG, MeshConfig(4), OPTIM, feedback), 0, zfp)
