"""Sharded parameters gathered in the forward and kept for the backward (``mesh.shard.gather:
keep``, `jaxhc.parallel.keep`) on the XLA transport: ZeRO-1's bits with the same policy, one
gather of each layer per micro-batch, and a checkpoint that resumes bit for bit.

Under a lossy param codec every rank computes with the decoded gathered values, as under ZeRO-1,
whose first step runs on the exact initial parameters: the losses, gradient norms and optimizer
state (moments and the master copy) are ZeRO-1's bit for bit.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np
import pytest
from _gpt import CFG, OPTIM, SEED, assert_trees_equal, batch, step_losses

import jaxhc
from jaxhc.data import Batches, corpus_bytes
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step, params_to_single
from jaxhc.parallel.keep import plain_params
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import ExperimentConfig, TrainConfig
from jaxhc.train.loop import XlaRunner

STEPS = 3
ZFP = jaxhc.Policy.from_dict({"name": "zfp8-data", "axes": {"data": "zfp:8"}, "min_bytes": 0})
# Blocks of 1024 values: more than a piece's default alignment (the layout widens it).
Q4_1024 = jaxhc.Policy.from_dict(
    {"name": "q4-1024-data", "axes": {"data": "q4:b1024:h"}, "min_bytes": 0}
)
POLICIES = {"none": "none", "zfp8": ZFP, "q4_1024": Q4_1024}


@functools.cache
def _run(policy: str, data: int, micro: int, shard: tuple = ()):
    """(per-step (loss, grad_norm) bits, single-layout params, opt_state, a step's ledger)."""
    mesh_cfg = MeshConfig(data, 1, 1, micro, shard=dict(shard))
    mesh = make_mesh(mesh_cfg, jax.devices()[:data])
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, POLICIES[policy])
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED, policy=POLICIES[policy])
    metrics, ledger = [], jaxhc.accounting.Ledger()
    for i in range(STEPS):
        with ledger if i == 0 else contextlib.nullcontext():  # the traced step's traffic
            state, m = step(state, batch(i, size=8))
            jax.block_until_ready(m)  # the ledger's callbacks run with the step
        metrics.append(np.array([m["loss"], m["grad_norm"]], np.float32).view(np.uint32))
    single = params_to_single(state, CFG, mesh_cfg)
    return (
        np.array(metrics),
        single,
        jax.device_get(state.opt_state),
        ledger.per_axis(devices=data, by_kind=True),
    )


def _keep(data):
    return (("params", data), ("gather", "keep"))


@pytest.mark.parametrize(
    "policy, data, micro",
    [pytest.param(p, 4, 1, marks=pytest.mark.slow) for p in ("none", "q4_1024")]
    + [("zfp8", 4, 1)]
    + [pytest.param(p, 2, 2, marks=pytest.mark.slow) for p in ("none", "zfp8")],  # CI time
)
def test_keep_is_zero_1_bit_for_bit(policy, data, micro):
    zero1, keep = _run(policy, data, micro), _run(policy, data, micro, _keep(data))
    np.testing.assert_array_equal(keep[0], zero1[0])
    assert_trees_equal(keep[2], zero1[2])  # moments and master copy
    if policy == "none":  # (under zfp ZeRO-1 holds the decoded copy, keep the master chunk)
        assert_trees_equal(keep[1], zero1[1])


def test_pieces_are_whole_blocks_of_the_data_codecs_and_stochastic_rounding_is_refused():
    """A layer's piece codes as in the whole vector (the bits of ZeRO-1 above) when the pieces
    are whole blocks of every lossy data codec, 1024 values included; a codec that codes by a
    value's index in the whole message cannot be cut per layer, and keep refuses it in one line."""
    for policy, block in (("none", 256), ("zfp8", 256), ("q4_1024", 1024)):
        for shard in ((), _keep(4)):
            mesh_cfg = MeshConfig(4, 1, 1, 1, shard=dict(shard))
            layout = Plan(CFG, mesh_cfg, OPTIM, POLICIES[policy]).layout
            assert layout.align == block and layout.layer_width % block == 0, (policy, shard)
            assert layout.shared_width % block == 0, (policy, shard)
    sr = jaxhc.Policy.from_dict({"name": "sr", "axes": {"data": "q8:sr"}, "min_bytes": 0})
    assert Plan(CFG, MeshConfig(4, 1, 1, 1), OPTIM, sr).layout.align == 256  # ZeRO-1 takes it
    with pytest.raises(ValueError, match=r"^policy sr: codec q8:sr on data codes a value by its"):
        Plan(CFG, MeshConfig(4, 1, 1, 1, shard=dict(_keep(4))), OPTIM, sr)


def test_keep_gathers_each_layer_once_per_micro_batch():
    """Per device and step over the data axis: ZeRO-1's parameter bytes (the whole vector once,
    after its update) and, per layer and micro-batch, one gather of the layer's segment (the
    forward's; per-layer ZeRO-3 gathers it again in the backward)."""
    data, micro = 2, 2
    keep = _run("none", data, micro, _keep(data))[3]["data/param"]
    fl = Plan(CFG, MeshConfig(data, 1, 1, micro, shard=dict(_keep(data)))).layout
    part = (data - 1) / data * 4
    assert keep["calls"] == 1 + micro * fl.layers
    assert keep["raw_bytes"] == pytest.approx(
        part * (fl.shared_padded + micro * fl.layers * fl.layer_padded), rel=1e-12
    )


def test_the_first_step_gathers_uncoded_under_a_lossy_param_codec():
    plain = plain_params(ZFP)
    assert plain.codec_for("data", "param") is None
    assert plain.codec_for("data", "grad") == ZFP.codec_for("data", "grad")
    assert plain_params(None) is None


def _runner(shard: dict, policy) -> XlaRunner:
    cfg = ExperimentConfig(
        model=CFG.__class__(**{**CFG.__dict__, "vocab_size": 256}),  # the corpus' bytes
        mesh=MeshConfig(2, 1, 1, 1, shard=shard),
        optim=OPTIM,
        train=TrainConfig(steps=4, batch_size=8, ckpt_every=2),
        compression=policy,
    )
    return XlaRunner(cfg, jax.devices()[:2])


@pytest.mark.slow  # CI time: the quick suite resumes in test_train_mpi.py and test_checkpoint.py
@pytest.mark.parametrize("policy", ["none", "zfp8"])
def test_a_checkpoint_of_keep_resumes_bit_for_bit(tmp_path, policy):
    """Saved after two steps, restored into a fresh state: the next two losses and the final
    optimizer state are the uninterrupted run's."""
    batches = Batches(corpus_bytes(), 8, CFG.block_size, 0)
    runner = _runner({"params": 2, "gather": "keep"}, POLICIES[policy])
    state, _ = step_losses(runner, runner.init_state(), batches, (0, 1))
    ckpt = Checkpoints(str(tmp_path / policy))
    assert runner.save(ckpt, 2, state)
    state, want = step_losses(runner, state, batches, (2, 3))
    want_opt = jax.device_get(state.opt_state)
    restored = runner.restore(ckpt, runner.init_state())
    restored, got = step_losses(runner, restored, batches, (2, 3))
    assert got == want
    assert_trees_equal(jax.device_get(restored.opt_state), want_opt)


def test_gather_names_keep_among_its_choices():
    with pytest.raises(ValueError, match=r"mesh.shard.gather='kept' must be one of .*keep"):
        MeshConfig(8, shard={"params": 8, "gather": "kept"})
