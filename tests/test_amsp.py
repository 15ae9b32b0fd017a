"""AMSP sharding plans: P, G and OS split over their own groups of the data axis.

The oracle is jaxhc's ZeRO (gradients and optimizer state split over the whole data axis), run on
the same data levels: under policy none every valid plan must give its losses, gradient norms and
parameters bit for bit, since each level of the reduction adds in rank order whatever the plan.
Plans on different levels add in different orders: those agree within rounding.
"""

from __future__ import annotations

import functools
import json
import os
import re

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, assert_trees_equal, batch, step_losses
from _tiers import quick

import jaxhc
from jaxhc.data import Batches, corpus_bytes
from jaxhc.model.config import MeshConfig, ShardConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step, params_to_single
from jaxhc.parallel.amsp import ShardPlan
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import ExperimentConfig, TrainConfig, load
from jaxhc.train.loop import XlaRunner

STEPS = 3


def plans(data: int, groups: tuple[int, ...]):
    """Every valid (grads, optim) of a data axis of `data` ranks on nested `groups` (params 1)
    but (data, data): ZeRO on those groups, the oracle itself."""
    sizes = (1, *groups, data)
    return [(g, o) for o in sizes for g in sorted({1, o}) if (g, o) != (data, data)]


def sharded_plans(data: int, groups: tuple[int, ...]):
    """Every valid (params, grads, optim) with params > 1 (grads = params or optim)."""
    sizes = (1, *groups, data)
    return [(p, g, o) for o in sizes for p in sizes if 1 < p <= o for g in sorted({p, o})]


@functools.cache
def run(data: int, tensor: int, pipe: int, grads=None, optim=None, groups=None, params=None):
    """(per-step (loss, grad_norm) as float32 bits, final params, final opt state blocks)."""
    shard = ShardConfig(params=params, grads=grads, optim=optim, groups=groups)
    mesh_cfg = MeshConfig(data, tensor, pipe, 2, shard=shard)
    mesh = make_mesh(mesh_cfg, jax.devices()[: mesh_cfg.size])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, "none")
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    metrics = []
    for i in range(STEPS):
        state, m = step(state, batch(i, size=16))
        metrics.append(np.array([m["loss"], m["grad_norm"]], np.float32).view(np.uint32))
    single = params_to_single(state, CFG, mesh_cfg)
    return np.array(metrics), single, jax.device_get(state.opt_state)


# --- the plan ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shard, message",
    [
        ({"optim": 3}, r"mesh.shard.optim=3 does not divide mesh.data=8"),
        ({"grads": 4, "optim": 2}, r"mesh.shard.grads=4 must divide mesh.shard.optim=2 \(AMSP"),
        ({"grads": 2, "optim": 4}, r"mesh.shard.grads=2 must equal mesh.shard.params=1 or"),
        ({"params": 4, "grads": 2}, r"mesh.shard.params=4 must divide mesh.shard.grads=2 \("),
        ({"params": 2, "grads": 4}, r"mesh.shard.grads=4 must equal mesh.shard.params=2 or"),
        ({"params": 2, "groups": [4]}, r"mesh.shard.params=2 is not 1, mesh.data=8 or one of"),
        ({"optim": 2, "groups": [4]}, r"mesh.shard.optim=2 is not 1, mesh.data=8 or one of"),
        ({"groups": [3]}, r"mesh.shard.groups=\[3\]: each size must be a proper divisor"),
        ({"groups": [8]}, r"mesh.shard.groups=\[8\]: each size must be a proper divisor"),
        ({"groups": 4}, r"'mesh.shard.groups' must be a list, got 4"),
        ({"optim": 0}, r"mesh.shard.optim=0 must be a positive integer"),
        ({"optimizer": 2}, r"unknown config key 'mesh.shard.optimizer'"),
    ],
)
def test_an_impossible_plan_is_one_line_naming_the_key(shard, message):
    with pytest.raises(ValueError, match=message) as err:
        MeshConfig(data=8, shard=shard)
    assert "\n" not in str(err.value)


def test_the_config_takes_a_plan_and_rechecks_it_against_the_data_axis():
    cfg = load(None, ["mesh.data=8", "mesh.tensor=1", "mesh.pipe=1", "mesh.shard.optim=4"])
    assert cfg.mesh.shard == ShardConfig(optim=4)
    assert ShardPlan.of(cfg.mesh).grads == 4  # grads default to optim: ZeRO on groups of 4
    with pytest.raises(ValueError, match=r"mesh.shard.optim=4 does not divide mesh.data=2"):
        load(None, ["mesh.data=2", "mesh.tensor=4", "mesh.pipe=1", "mesh.shard.optim=4"])


def test_the_data_axis_is_factored_into_nested_groups_innermost_last():
    flat = ShardPlan.of(MeshConfig(data=8, shard={"grads": 1}))
    assert (flat.axes, flat.grad_axes, flat.optim_axes) == (("data",), (), ("data",))
    p = ShardPlan.of(MeshConfig(data=8, shard={"grads": 1, "optim": 4, "groups": [2, 4]}))
    assert (p.axes, p.sizes) == (("data.0", "data.1", "data.2"), (2, 2, 2))
    assert (p.grad_axes, p.optim_axes) == ((), ("data.1", "data.2"))
    # Rank d = 4 a + 2 b + c holds optimizer chunk 2 c + b; only a = 0 writes it.
    assert [p.optim_chunk(d) for d in range(8)] == [
        (0, True), (2, True), (1, True), (3, True), (0, False), (2, False), (1, False), (3, False)
    ]  # fmt: skip


def test_sub_axes_take_the_policy_of_data_unless_they_have_their_own():
    policy = jaxhc.Policy.from_dict({"axes": {"data": "zfp:8", "data.0": "zfp:16"}})
    assert policy.codec_for("data.1", "grad") == policy.codec_for("data", "grad")
    assert policy.codec_for("data.0", "grad").rate == 16
    assert policy.codec_for(("data.0", "data.1"), "grad").rate == 16  # the most faithful


# --- training: bit for bit ---------------------------------------------------------------------


def assert_same_run(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    assert_trees_equal(a[1], b[1])


@pytest.mark.parametrize("grads, optim", quick([(1, 1), (1, 8)], {(1, 8)}))
def test_plans_of_a_flat_data_axis_are_zero_bit_for_bit(grads, optim):
    """DDP (1, 1, 1) and ZeRO-1 as AMSP counts it (1, 1, 8) against ZeRO-2 (1, 8, 8), the oracle
    itself: gradients summed over one level, in the order ZeRO's reduce-scatter sums them."""
    assert_same_run(run(8, 1, 1, grads, optim), run(8, 1, 1))


# Every plan runs under `slow` (`make test-all`); the quick suite keeps a few of each family.
QUICK_NESTED = {(1, 2)}


@pytest.mark.parametrize("grads, optim", quick(plans(8, (2, 4)), QUICK_NESTED))
def test_every_plan_of_data_8_on_nested_groups_is_zero_on_them_bit_for_bit(grads, optim):
    """data = 8 as groups of 2 within groups of 4: every valid plan; against flat ZeRO, which adds
    in another order, within rounding."""
    got = run(8, 1, 1, grads, optim, (2, 4))
    assert_same_run(got, run(8, 1, 1, None, None, (2, 4)))
    flat = run(8, 1, 1)
    losses = [m.view(np.float32) for m in (got[0], flat[0])]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


# All under `slow` (the quick suite's one case was (4, 4), the oracle's own plan); the quick
# suite keeps ZeRO-3 on data 4 with tensor or pipe (the sharded-parameter test below).
@pytest.mark.slow
@pytest.mark.parametrize("tensor, pipe", [(2, 1), (1, 2)])
@pytest.mark.parametrize("grads, optim", plans(4, (2,)))
def test_every_plan_of_data_4_with_tensor_or_pipe_is_zero_bit_for_bit(tensor, pipe, grads, optim):
    got = run(4, tensor, pipe, grads, optim, (2,))
    assert_same_run(got, run(4, tensor, pipe, None, None, (2,)))


# Sharded parameters (s_p > 1): a few plans in the quick suite, every one under `slow`.
QUICK_8 = {(2, 2, 8)}  # ZeRO-3 itself: the flat-axis test below
QUICK_4 = {(4, 4, 4)}


@pytest.mark.parametrize("params, grads, optim", quick(sharded_plans(8, (2, 4)), QUICK_8))
def test_sharded_parameters_on_data_8_are_zero_bit_for_bit(params, grads, optim):
    """ZeRO-3 (8, 8, 8) and every plan with s_p > 1 on groups [2, 4]: parameters gathered for
    the forward and again for the backward, whose reverse mode reduce-scatters the gradients
    over the same levels: the losses, norms and parameters of ZeRO on those levels, bit for bit."""
    got = run(8, 1, 1, grads, optim, (2, 4), params)
    assert_same_run(got, run(8, 1, 1, None, None, (2, 4)))


def test_zero_3_on_a_flat_data_axis_is_zero_bit_for_bit():
    assert_same_run(run(8, 1, 1, None, None, None, 8), run(8, 1, 1))


@pytest.mark.parametrize("tensor, pipe", quick([(2, 1), (1, 2)], {(1, 2)}))
@pytest.mark.parametrize("params, grads, optim", quick(sharded_plans(4, (2,)), QUICK_4))
def test_sharded_parameters_on_data_4_with_tensor_or_pipe_are_zero_bit_for_bit(
    tensor, pipe, params, grads, optim
):
    got = run(4, tensor, pipe, grads, optim, (2,), params)
    assert_same_run(got, run(4, tensor, pipe, None, None, (2,)))


def test_a_device_holds_its_parameter_chunk_only():
    """(2, 2, 8) on data = 8: each device's parameters are 1/2 of its padded flat vector, the
    same on the 4 replicas of a chunk (devices d and d + 2, d + 4, d + 6), and its optimizer
    state 1/8."""
    mesh_cfg = MeshConfig(8, 1, 1, 2, shard={"params": 2, "grads": 2, "optim": 8, "groups": [2]})
    plan = Plan(CFG, mesh_cfg, OPTIM)
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, "none")
    state, _ = step(state, batch(0, size=16))
    chunk = plan.layout.padded // 2
    shards = state.params.addressable_shards
    assert {s.data.shape for s in shards} == {(1, 1, chunk)}
    assert {s.data.shape for s in state.opt_state["master"].addressable_shards} == {
        (1, 1, plan.layout.padded // 8)
    }
    blocks = np.asarray(state.params).reshape(8, chunk)
    for d in range(8):
        np.testing.assert_array_equal(blocks[d], blocks[d % 2])
    assert not np.array_equal(blocks[0], blocks[1])


@pytest.mark.slow  # CI time: the quick suite keeps the bit-exact plan tests
def test_zero_3_moves_the_bytes_of_its_collectives_and_holds_one_gathered_copy():
    """ZeRO-3 (4, 4, 4) with pipe 2 and ``gather: whole``: per device and step the parameters
    are all-gathered once
    and the gradients reduce-scattered once; the update gathers nothing (s_p = s_os); the
    pipeline's traffic is ZeRO's. The compiled step's arguments shrink by the 3/4 of the flat
    parameter vector a device no longer keeps, and its temporaries grow by at most one gathered
    copy of it (no second copy is kept between the forward and the backward; on this model
    they even shrink a little)."""
    mesh = make_mesh(MeshConfig(4, 1, 2, 2), jax.devices()[:8])
    layout = Plan(CFG, MeshConfig(4, 1, 2, 2)).layout
    padded = layout.padded
    got, memory = {}, {}
    zero3 = MeshConfig(4, 1, 2, 2, shard={"params": 4, "gather": "whole"})
    for name, cfg in (("zero3", zero3), ("zero", MeshConfig(4, 1, 2, 2))):
        step = make_train_step(CFG, cfg, OPTIM, mesh, "none")
        state = init_state(CFG, cfg, OPTIM, mesh, SEED)
        memory[name] = step.lower(state, batch(0, size=16)).compile().memory_analysis()
        ledger = jaxhc.accounting.Ledger()
        with ledger:
            state, m = step(state, batch(0, size=16))
            jax.block_until_ready(m)
        got[name] = ledger.per_axis(devices=8, by_kind=True)
    n = 4 * padded  # float32 bytes of a device's flat vector
    assert got["zero3"]["data/param"]["raw_bytes"] == 3 * (n / 4)
    assert got["zero3"]["data/grad"]["raw_bytes"] == 3 / 4 * n
    assert got["zero"]["data/param"]["raw_bytes"] == 3 * (n / 4)
    for key in ("pipe/act", "pipe/grad"):
        assert got["zero3"][key] == got["zero"][key], key
    a, b = memory["zero3"], memory["zero"]
    assert b.argument_size_in_bytes - a.argument_size_in_bytes == 4 * layout.size - n / 4
    assert a.temp_size_in_bytes - b.temp_size_in_bytes <= n


def test_optimizer_state_is_split_over_its_group_and_equal_on_its_replicas():
    """(1, 1, 4) on data = 8: each device holds 1/4 of the padded vector; devices d and d + 4
    (the same chunk in the two groups) hold the same values after training."""
    mesh_cfg = MeshConfig(8, 1, 1, 2, shard={"grads": 1, "optim": 4})
    plan = Plan(CFG, mesh_cfg, OPTIM)
    _, _, opt = run(8, 1, 1, 1, 4)
    mu = opt["adam"][0].mu
    chunk = plan.layout.padded // 4
    assert mu.shape == (1, 1, 8 * chunk)
    blocks = mu.reshape(8, chunk)
    assert np.abs(blocks).min(axis=1).max() >= 0 and np.abs(blocks[:4]).sum() > 0
    np.testing.assert_array_equal(blocks[:4], blocks[4:])
    assert not np.array_equal(blocks[0], blocks[1])


def test_each_collective_runs_over_its_group():
    """(1, 4, 4) on data = 8: the gradients reduce-scattered over the inner groups of 4
    ("data.1"), their chunks summed over the 2 groups ("data.0"), the parameters all-gathered
    over the inner groups: the ledger's raw bytes per device are those of the ring collectives."""
    mesh_cfg = MeshConfig(8, 1, 1, 2, shard={"optim": 4})
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    padded = Plan(CFG, mesh_cfg).layout.padded
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, "none")
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        state, m = step(state, batch(0, size=16))
        jax.block_until_ready(m)
    got = ledger.per_axis(devices=8, by_kind=True)
    n = 4 * padded  # float32 bytes of the flat vector
    assert got["data.1/grad"]["raw_bytes"] == 3 / 4 * n
    assert got["data.0/grad"]["raw_bytes"] == 2 * (1 / 2) * (n / 4)
    assert got["data.1/param"]["raw_bytes"] == 3 * (n / 4)
    assert "data.0/param" not in got and not any(k.startswith("data/") for k in got)


def test_a_nested_plan_moves_only_jaxhc_payloads():
    """With the identity codec on "data" (its sub-axes take it), the compiled step of a nested
    plan moves uint8 payloads only, but for the two scalar sums (the loss, the gradient norm)."""
    from test_model_hlo import collectives

    policy = jaxhc.Policy.from_dict({"name": "id", "min_bytes": 0, "axes": {"data": "none"}})
    mesh_cfg = MeshConfig(8, 1, 1, 2, shard={"grads": 1, "optim": 4, "groups": [2, 4]})
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, policy)
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    found = collectives(step.lower(state, batch(0, size=16)).compile().as_text())
    assert {"all-to-all", "all-gather"} <= {op for op, _ in found}
    others = [(op, t) for op, t in found if set(re.findall(r"(\w+)\[", t)) != {"u8"}]
    # The scalars are gathered over all 8 devices and added in rank order (`zero.psum_scalar`);
    # over the same devices here (tensor = pipe = 1), XLA may combine the two gathers into one.
    assert {op for op, _ in others} == {"all-gather"}, others
    scalars = [re.findall(r"\w+\[[^\]]*\]", t) for _, t in others]
    assert all(set(x) == {"f32[8]"} for x in scalars) and sum(map(len, scalars)) == 2, others


# --- checkpoints -------------------------------------------------------------------------------


def _runner(shard: dict, compression="none") -> XlaRunner:
    mesh_cfg = MeshConfig(8, 1, 1, 2, shard=shard)
    train = TrainConfig(steps=4, batch_size=16, ckpt_every=2)
    cfg = ExperimentConfig(
        model=CFG.__class__(**{**CFG.__dict__, "vocab_size": 256}),
        mesh=mesh_cfg,
        optim=OPTIM,
        train=train,
        compression=compression,
    )
    return XlaRunner(cfg, jax.devices()[:8])


@pytest.mark.slow  # ~30 s quiet; the quick suite resumes s_p = 1 <-> 8 in a lighter test
def test_a_checkpoint_resumes_under_another_plan_bit_for_bit(tmp_path):
    """Two steps under (1, 1, 4), saved; resumed under (1, 2, 2) on the same groups and under
    DDP: the next two losses are those of the uninterrupted run (the same levels: bit for bit)."""
    groups = [2, 4]
    batches = Batches(corpus_bytes(), 16, CFG.block_size, 0)
    a = _runner({"grads": 1, "optim": 4, "groups": groups})
    state = a.init_state()
    for i in range(2):
        state, _ = a.step(state, batches.train(i))
    ckpt = Checkpoints(str(tmp_path))
    assert a.save(ckpt, 2, state)
    want = []
    for i in (2, 3):
        state, m = a.step(state, batches.train(i))
        want.append(float(m["loss"]))
    for shard in ({"grads": 2, "optim": 2, "groups": groups}, {"optim": 1, "groups": groups}):
        b = _runner(shard)
        restored = b.restore(ckpt, b.init_state())
        got = []
        for i in (2, 3):
            restored, m = b.step(restored, batches.train(i))
            got.append(float(m["loss"]))
        assert got == want, shard


# --- compressed plans through the command line ---------------------------------------------------

TINY = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=4",
    "model.block_size=16",
    "train.batch_size=8",
    "train.eval_every=2",
    "train.eval_batches=1",
    "mesh.microbatches=2",
    "--mesh",
    "data=4,tensor=2,pipe=1",
    "--steps",
    "3",
    "--no-progress",
    "mesh.shard.grads=1",
    "mesh.shard.optim=2",
    "train.fidelity_every=1",
]


@pytest.mark.slow  # CI time: the quick suite keeps the bit-exact plan tests
def test_a_compressed_nested_plan_trains_within_its_codecs_fidelity(tmp_path):
    """zfp:8 on the data sub-axes (every message): data.1 carries the compressed gradients at
    ~8/32 of their raw bytes; the sampled fidelity of the reduction and the losses stay close to
    the uncompressed run of the same plan, which samples no error at all."""
    from jaxhc import cli

    policy = tmp_path / "zdata.yaml"
    policy.write_text("name: zdata\nmin_bytes: 0\naxes:\n  data: zfp:8\n")
    records = {}
    for name in ("none", str(policy)):
        out = tmp_path / ("run-" + os.path.basename(name))
        assert cli.main(["train", "--out", str(out), "--compression", name, *TINY]) == 0
        with open(out / "metrics.jsonl") as f:
            records[name] = [json.loads(line) for line in f]
    plain, zfp = records["none"], records[str(policy)]
    assert all(r["grad_rel_err"] == 0 and r["grad_cos"] == pytest.approx(1) for r in plain)
    assert all(1e-4 < r["grad_rel_err"] < 0.2 and r["grad_cos"] > 0.98 for r in zfp), zfp
    for axis in ("data.0", "data.1"):
        raw, wire = zfp[0]["raw_bytes"][axis], zfp[0]["wire_bytes"][axis]
        assert raw * 8 / 32 < wire < raw * 8 / 32 * 1.05, (axis, raw, wire)
    np.testing.assert_allclose([r["loss"] for r in zfp], [r["loss"] for r in plain], rtol=2e-3)


@pytest.mark.slow  # CI time: the quick suite resumes on another mesh (test_checkpoint.py)
def test_a_checkpoint_resumes_between_replicated_and_sharded_parameters_bit_for_bit(tmp_path):
    """Saved under s_p = 1 (ZeRO), resumed under ZeRO-3 (s_p = 8); saved under ZeRO-3, resumed
    under ZeRO: the next losses and the final parameters are the uninterrupted run's, bit for
    bit (the canonical layout names no plan)."""
    batches = Batches(corpus_bytes(), 16, CFG.block_size, 0)
    runs = {"zero": _runner({}), "zero3": _runner({"params": 8})}
    for first, second in (("zero", "zero3"), ("zero3", "zero")):
        a, b = runs[first], runs[second]
        state, _ = step_losses(a, a.init_state(), batches, (0, 1))
        ckpt = Checkpoints(str(tmp_path / first))
        assert a.save(ckpt, 2, state)
        state, want = step_losses(a, state, batches, (2, 3))
        want_params = a.plan.single_params(state.params)
        restored = b.restore(ckpt, b.init_state())
        restored, got = step_losses(b, restored, batches, (2, 3))
        assert got == want, (first, second)
        assert_trees_equal(b.plan.single_params(restored.params), want_params)


# --- error feedback on a nested data axis ----------------------------------------------------

EF_POLICY = """\
name: ef-nested
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8, error_feedback: true, param: "off"}
"""


@pytest.mark.slow  # CI time (~130 s): the quick suite keeps flat error feedback and nested plans
def test_nested_error_feedback_keeps_a_residual_per_level_and_is_plan_free(tmp_path):
    """zfp:8 with error feedback on the gradients of groups [2, 4] (parameters exchanged raw):
    each level's reduce-scatter keeps its residual (the padded vector, then 1/2, then 1/4 of
    it); the residuals depend on the levels only, so ZeRO and ZeRO-3 give the same
    losses bit for bit, and the codec's loss stays close to the uncompressed run. (A plan with
    s_g < data also all-gathers the lossy gradient chunks back, without residual: other bits.)"""
    policy = tmp_path / "ef.yaml"
    policy.write_text(EF_POLICY)
    batches = Batches(corpus_bytes(), 16, CFG.block_size, 0)
    got = {}
    # (2, 8, 8) resumes into both of these in the slow test below (CI time)
    for shard in ({"groups": [2, 4]}, {"params": 8, "groups": [2, 4]}):
        r = _runner(shard, str(policy))
        state, losses = step_losses(r, r.init_state(), batches, range(3))
        got[str(shard)] = losses
        residual = np.array(state.opt_state["residual"]).reshape(8, -1)
        padded = r.plan.layout.padded
        assert residual.shape[1] == padded + padded // 2 + padded // 4
        parts = np.split(residual, [padded, padded + padded // 2], axis=1)
        assert all(np.abs(p).max() > 0 for p in parts)
    assert len({tuple(v) for v in got.values()}) == 1, got
    plain = _runner({"groups": [2, 4]})
    _, exact = step_losses(plain, plain.init_state(), batches, range(3))
    np.testing.assert_allclose(
        np.array(got[str({"groups": [2, 4]})]).view(np.float32),
        np.array(exact).view(np.float32),
        rtol=2e-3,
    )


@pytest.mark.slow  # ~30 s quiet; the quick suite resumes flat error feedback (test_train.py)
def test_nested_error_feedback_resumes_bit_for_bit(tmp_path):
    """Residuals of every level are checkpointed (``residual``, ``residual.1``, ...) and
    restored exactly: resumed under the same plan (2, 8, 8), under ZeRO-3 and under ZeRO on the
    same groups, the next losses are the uninterrupted run's."""
    policy = tmp_path / "ef.yaml"
    policy.write_text(EF_POLICY)
    batches = Batches(corpus_bytes(), 16, CFG.block_size, 0)
    plans = ({"params": 2, "groups": [2, 4]}, {"params": 8, "groups": [2, 4]}, {"groups": [2, 4]})
    a = _runner(plans[0], str(policy))
    state, _ = step_losses(a, a.init_state(), batches, (0, 1))
    ckpt = Checkpoints(str(tmp_path / "ckpt"))
    assert a.save(ckpt, 2, state)
    saved = np.array(state.opt_state["residual"])
    state, want = step_losses(a, state, batches, (2, 3))
    for shard in plans:
        b = _runner(shard, str(policy))
        restored = b.restore(ckpt, b.init_state())
        np.testing.assert_array_equal(np.array(restored.opt_state["residual"]), saved)
        _, got = step_losses(b, restored, batches, (2, 3))
        assert got == want, shard
