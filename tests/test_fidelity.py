"""The fidelity sample: the compressed gradient reduction against an exact one."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc.parallel import fidelity, from_single, init_state, make_train_step, zero
from jaxhc.parallel.state import Plan
from tests._gpt import CFG, OPTIM, POLICIES, SEED, batch, mesh_of, parallel_run


def test_compare_counts_each_parameter_once():
    """Against numpy on the single layout: parameters replicated over "tensor" or "pipe" (wte,
    LayerNorms, ...) are held by several ranks but count once, as in the gradient norm."""
    mesh_cfg, mesh = mesh_of("2x2x2")
    plan = Plan(CFG, mesh_cfg)
    rng = np.random.default_rng(0)

    def draw(scale):
        return jax.tree.map(
            lambda s: (scale * rng.normal(size=s.shape)).astype(np.float32), plan.param_shapes
        )

    exact = draw(1.0)
    g = jax.tree.map(np.add, exact, draw(0.1))

    def per_shard(g, e):
        start = zero.chunk_start(plan.layout)
        g, e = (
            lax.dynamic_slice_in_dim(plan.layout.flatten(t), start, plan.layout.chunk)
            for t in (g, e)
        )
        return fidelity.compare(g, e, plan.layout)

    specs = (plan.param_specs, plan.param_specs)
    mapped = jax.shard_map(per_shard, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)
    got = jax.jit(mapped)(from_single(g, mesh), from_single(exact, mesh))
    flat = [
        np.concatenate([x.ravel() for x in jax.tree.leaves(t)]).astype(np.float64)
        for t in (g, exact)
    ]
    want_err = np.linalg.norm(flat[0] - flat[1]) / np.linalg.norm(flat[1])
    want_cos = flat[0] @ flat[1] / np.linalg.norm(flat[0]) / np.linalg.norm(flat[1])
    np.testing.assert_allclose(got["grad_rel_err"], want_err, rtol=1e-5)
    np.testing.assert_allclose(got["grad_cos"], want_cos, rtol=1e-6)


def _run(policy: str, every: int, steps: int):
    mesh_cfg, mesh = mesh_of("2x2x2")
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, POLICIES[policy], fidelity_every=every)
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    metrics, traffic = [], []
    for i in range(steps):
        ledger = jaxhc.accounting.Ledger()
        with ledger:
            state, m = step(state, batch(i))
            metrics.append({k: np.asarray(v) for k, v in m.items()})
        traffic.append(ledger.per_axis(devices=mesh.size, by_kind=True))
    return metrics, traffic


def test_sampled_steps_measure_the_lossy_reduction_and_change_nothing():
    """zfp on every message, sampled every 2nd step: NaN between samples, a small error on them;
    the losses are bit for bit those of the run without sampling, and the extra reduction is not
    in the ledger's traffic."""
    metrics, traffic = _run("zhybrid", every=2, steps=3)
    _, plain, _ = parallel_run("2x2x2", "zhybrid", steps=3)
    for got, want in zip(metrics, plain, strict=True):
        assert got["loss"].view(np.uint32) == want["loss"].view(np.uint32)
    assert np.isnan(metrics[1]["grad_rel_err"]) and np.isnan(metrics[1]["grad_cos"])
    for m in (metrics[0], metrics[2]):
        assert 1e-4 < m["grad_rel_err"] < 0.2 and 0.98 < m["grad_cos"] < 1.0, m
    assert traffic[0] == traffic[1] == traffic[2]  # fixed-rate codecs: the same every step


@pytest.mark.slow  # CI time: the lossy test above checks the same sampling
def test_an_exact_reduction_measures_zero_error():
    metrics, _ = _run("none", every=1, steps=1)
    assert metrics[0]["grad_rel_err"] == 0.0
    np.testing.assert_allclose(metrics[0]["grad_cos"], 1.0, rtol=1e-6)
