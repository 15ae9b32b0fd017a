"""Sharded checkpoints: the canonical layout, atomic saves, resuming onto another mesh.

The oracle for the layout (tests/_canonical_oracle.py) converts whole arrays with the trainer's own
flat ZeRO layout; the checkpoint code never builds a whole array, it writes and reads each
device's boxes. The MPI case (written by 2 ranks, resumed by 4 and by 1) is in
tests/test_train_mpi.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import jax
import numpy as np
import pytest
from _canonical_oracle import coords_of, from_canonical, on_mesh, to_canonical
from _gpt import assert_trees_equal

from jaxhc import partition
from jaxhc.data import Batches, corpus_bytes
from jaxhc.model.config import AXES, GPTConfig, MeshConfig, OptimConfig
from jaxhc.parallel import TrainState, params_to_single
from jaxhc.parallel.canonical import Canonical, flat_boxes, storage_chunks
from jaxhc.parallel.state import Plan
from jaxhc.train import checkpoint
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import ExperimentConfig, TrainConfig
from jaxhc.train.loop import XlaRunner

MODEL = GPTConfig(vocab_size=256, block_size=16, n_layer=4, n_head=4, n_embd=32)
OPTIM = OptimConfig(lr=3e-3, warmup_steps=1, total_steps=6)
EF_POLICY = """\
name: ef
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8, error_feedback: true}
"""


def mesh(d, t, p):
    return MeshConfig(data=d, tensor=t, pipe=p, microbatches=2 if p > 1 else 1)


def random_canonical(plan: Plan, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        n: rng.integers(1, 100, a.shape).astype(a.dtype)
        if a.dtype.kind == "i"
        else rng.standard_normal(a.shape).astype(a.dtype)
        for n, a in Canonical(plan).arrays.items()
    }


def host_blocks(state: TrainState, plan: Plan):
    shape = dict(zip(AXES, plan.mesh_cfg.shape, strict=True))
    specs = jax.tree.leaves(plan.state_specs, is_leaf=partition.is_spec)
    leaves = jax.tree.leaves(state)
    for c in coords_of(plan.mesh_cfg):
        yield c, [partition.local_block(s, x, c, shape) for s, x in zip(specs, leaves, strict=True)]


# --- the layout --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 3, 2)])
def test_flat_boxes_cover_a_flat_range_in_order(shape):
    a = np.arange(np.prod(shape)).reshape(shape)
    rng = np.random.default_rng(0)
    for _ in range(50):
        lo, hi = sorted(rng.integers(0, a.size + 1, 2))
        boxes = flat_boxes(shape, lo, hi)
        got = np.concatenate([a[b].reshape(-1) for b in boxes]) if boxes else np.zeros(0)
        np.testing.assert_array_equal(got, a.reshape(-1)[lo:hi])
        assert len(boxes) <= 2 * len(shape)


def test_storage_chunks_tile_the_block():
    for block in [(4, 32, 3, 4, 8), (1 << 21,), (3, 1 << 20), (1000, 999)]:
        chunks = storage_chunks(block)
        assert all(b % c == 0 for b, c in zip(block, chunks, strict=True))
        assert np.prod(chunks) <= 1 << 20


PAIRS = [
    ((2, 2, 2), (4, 2, 1)),
    ((2, 2, 2), (1, 1, 1)),
    ((2, 2, 2), (8, 1, 1)),
    ((2, 2, 2), (1, 2, 4)),
    ((4, 1, 2), (2, 2, 2)),
    ((1, 1, 1), (2, 4, 1)),
]


@pytest.mark.parametrize("a, b", PAIRS)
def test_a_state_moves_between_meshes_exactly(tmp_path, a, b):
    """Random values (every element distinct) written on mesh a, read on mesh b: what the oracle
    gives, bit for bit; read on mesh a again: the state written."""
    plan_a, plan_b = Plan(MODEL, mesh(*a), OPTIM), Plan(MODEL, mesh(*b), OPTIM)
    canon = random_canonical(plan_a, 1)
    state = from_canonical(canon, plan_a)
    ckpt = Checkpoints(str(tmp_path))
    assert ckpt.save(3, plan_a, host_blocks(state, plan_a))
    assert ckpt.steps() == [3] and sorted(os.listdir(tmp_path)) == ["3"]
    assert_trees_equal(ckpt.read_global(plan_b), from_canonical(canon, plan_b))
    assert_trees_equal(ckpt.read_global(plan_a), state)
    assert to_canonical(state, plan_a).keys() == canon.keys()


@pytest.mark.parametrize("a, b", [((2, 2, 1), (2, 1, 2)), ((2, 2, 2), (4, 2, 1))])
def test_residuals_are_exact_on_the_same_data_size_and_keep_their_sum_otherwise(
    tmp_path, caplog, a, b
):
    policy = tmp_path / "ef.yaml"
    policy.write_text(EF_POLICY)
    plan_a = Plan(MODEL, mesh(*a), OPTIM, str(policy))
    plan_b = Plan(MODEL, mesh(*b), OPTIM, str(policy))
    canon = random_canonical(plan_a, 2)
    ckpt = Checkpoints(str(tmp_path / "ckpt"))
    assert ckpt.save(1, plan_a, host_blocks(from_canonical(canon, plan_a), plan_a))
    with caplog.at_level(logging.WARNING):
        got = to_canonical(ckpt.read_global(plan_b), plan_b)
    want = dict(canon)
    if a[0] != b[0]:
        assert "summed and spread evenly" in caplog.text
        for n in [n for n in canon if n.startswith("residual/")]:
            total = canon[n].astype(np.float64).sum(0)
            spread = (total / b[0]).astype(np.float32)
            want[n] = np.broadcast_to(spread, (b[0], *spread.shape))
            np.testing.assert_allclose(got[n].sum(0), total, rtol=1e-5, atol=1e-5)
    else:
        assert "residual" not in caplog.text
    assert got.keys() == want.keys()
    for n in want:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)


# --- atomic, finite, shared --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, np.nan, -np.inf])
def test_all_finite_checks_each_device_shard(bad):
    """A value in any one device's shard of a sharded array decides; integer leaves are ignored."""
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(devices, ("a", "b")), jax.sharding.PartitionSpec("a", "b")
    )
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    if bad is not None:
        x[5, 4] = bad  # on one device only
    tree = {"x": jax.device_put(x, sharding), "n": jax.numpy.arange(3), "h": np.ones(2)}
    assert checkpoint.all_finite(tree) == (bad is None)


def test_non_finite_states_and_failed_saves_never_become_latest(tmp_path, monkeypatch):
    plan = Plan(MODEL, mesh(2, 1, 2), OPTIM)
    state = from_canonical(random_canonical(plan, 3), plan)
    ckpt = Checkpoints(str(tmp_path))
    assert ckpt.save(1, plan, host_blocks(state, plan))
    assert not ckpt.save(2, plan, host_blocks(state, plan), finite=False)
    assert ckpt.steps() == [1]

    def broken(tmp, canon, blocks, scalars):  # a process dies half-way through its blocks
        raise OSError("disk full")

    monkeypatch.setattr(Checkpoints, "_write", lambda self, *args: broken(*args))
    with pytest.raises(OSError, match="checkpoint of step 2 .* failed: disk full"):
        ckpt.save(2, plan, host_blocks(state, plan))
    assert ckpt.latest_step() == 1 and ".tmp-2" in os.listdir(tmp_path)
    monkeypatch.undo()
    assert ckpt.save(2, plan, host_blocks(state, plan))
    assert ckpt.steps() == [1, 2] and ".tmp-2" not in os.listdir(tmp_path)
    assert_trees_equal(ckpt.read_global(plan, 2), state)


class ElsewhereGroup(checkpoint.Group):
    """Process 1 of a job whose process 0 wrote its token into a directory this one cannot see."""

    rank = 1

    def bcast(self, value):
        return "a token written on another host"


def test_a_directory_that_is_not_shared_is_refused_in_one_line(tmp_path):
    plan = Plan(MODEL, mesh(1, 1, 1), OPTIM)
    os.makedirs(tmp_path / ".tmp-1")
    (tmp_path / ".tmp-1" / ".token").write_text("this host's own token")
    ckpt = Checkpoints(str(tmp_path), group=ElsewhereGroup())
    with pytest.raises(OSError, match="is not shared: .* does not see what process 0 wrote"):
        ckpt.save(1, plan, [])
    assert ckpt.steps() == []


def test_keeps_the_newest_and_names_a_mismatch(tmp_path):
    plan = Plan(MODEL, mesh(1, 1, 1), OPTIM)
    state = from_canonical(random_canonical(plan, 4), plan)
    ckpt = Checkpoints(str(tmp_path), keep=2)
    for step in (1, 2, 3):
        assert ckpt.save(step, plan, host_blocks(state, plan))
    assert ckpt.steps() == [2, 3]
    other = Plan(dataclasses.replace(MODEL, n_embd=64), mesh(1, 1, 1), OPTIM)
    with pytest.raises(
        ValueError,
        match=r"3 does not match this run: params/blocks/attn/c_attn/bias is float32\[4, 3, 4, 8\] "
        r"there, float32\[4, 3, 4, 16\] here",
    ):
        ckpt.restore(other, coords_of(other.mesh_cfg))
    os.makedirs(tmp_path / "old" / "5")
    with pytest.raises(ValueError, match="no checkpoint to resume from .* another format"):
        Checkpoints(str(tmp_path / "old")).restore(plan, coords_of(plan.mesh_cfg))


# --- training: the next steps after resuming on another mesh ------------------------------------


def _cfg(m: MeshConfig) -> ExperimentConfig:
    train = TrainConfig(steps=4, batch_size=16, ckpt_every=2)
    return ExperimentConfig(model=MODEL, mesh=m, optim=OPTIM, train=train, compression="none")


def _two_steps(m: MeshConfig):
    """A runner on mesh m (8 devices), the batches, and the state after two steps."""
    runner = XlaRunner(_cfg(m), jax.devices()[:8])
    batches = Batches(corpus_bytes(), 16, MODEL.block_size, 0)
    state = runner.init_state()
    for i in range(2):
        state, _ = runner.step(state, batches.train(i))
    return runner, batches, state


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Two steps on 2 x 2 x 2, checkpointed; the state in memory and the next losses there."""
    runner, batches, state = _two_steps(mesh(2, 2, 2))
    ckpt = Checkpoints(str(tmp_path_factory.mktemp("ckpt")))
    assert runner.save(ckpt, 2, state)
    host = jax.device_get(state)
    losses = []
    for i in (2, 3):
        state, metrics = runner.step(state, batches.train(i))
        losses.append(float(metrics["loss"]))
    return ckpt, to_canonical(host, runner.plan), losses, batches


# The quick suite: a mesh with tensor and pipe; every mesh under `slow`.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "b",
    [
        pytest.param((4, 2, 1), marks=SLOW),
        pytest.param((1, 1, 1), marks=SLOW),
        pytest.param((8, 1, 1), marks=SLOW),
        (1, 2, 4),
    ],
)
def test_training_resumes_on_another_mesh(written, b):
    """Policy none: resumed on mesh b, the next two losses are those of a run on mesh b from the
    same state (placed there by the oracle), bit for bit; they continue the 2 x 2 x 2 run's within
    rounding."""
    ckpt, canon, losses, batches = written
    cfg = _cfg(mesh(*b))
    runner = XlaRunner(cfg, jax.devices()[: cfg.mesh.size])
    like = runner.init_state()
    restored = runner.restore(ckpt, like)
    oracle = on_mesh(from_canonical(canon, runner.plan), runner)
    assert_trees_equal(jax.device_get(restored), jax.device_get(oracle))
    got, want = [], []
    for i in (2, 3):
        restored, m = runner.step(restored, batches.train(i))
        got.append(float(m["loss"]))
        oracle, m = runner.step(oracle, batches.train(i))
        want.append(float(m["loss"]))
    print(f"\n{b}: resumed {got}, from the same state {want}, on 2x2x2 {losses}")
    assert got == want  # bit for bit: the restored state is the oracle's, the step the same
    np.testing.assert_allclose(got, losses, rtol=1e-4)


def test_stale_copies_of_shared_parameters_never_reach_a_checkpoint(tmp_path):
    """On 4 stages the middle ones read none of wte, wpe, ln_f and the last stage reads no wpe:
    those copies get zero gradients (AdamW's decay still moves wte and wpe) and drift from the
    first stage's, which holds the canonical copy. The last stage's wte and ln_f stay the
    first's bit for bit; a checkpoint (parameters and optimizer state) and `params_to_single`
    take the first stage's copies, and a resume puts them on every stage."""
    runner, batches, state = _two_steps(mesh(2, 1, 4))

    def per_stage(x):
        shards = {s.device: np.asarray(s.data) for s in x.addressable_shards}
        return [shards[d] for d in runner.mesh.devices[0, 0]]

    params = state.params
    wte, wpe = per_stage(params["wte"]), per_stage(params["wpe"])
    ln_f = per_stage(params["ln_f"]["scale"])
    for name, copies, stale in (
        ("wte", wte, (1, 2)),
        ("wpe", wpe, (1, 2, 3)),
        ("ln_f", ln_f, (1, 2)),
    ):
        for s in stale:
            assert not np.array_equal(copies[s], copies[0]), f"{name} on stage {s}"
    np.testing.assert_array_equal(wte[3], wte[0])
    np.testing.assert_array_equal(ln_f[3], ln_f[0])
    single = params_to_single(state)
    np.testing.assert_array_equal(single["wte"], wte[0])
    np.testing.assert_array_equal(single["wpe"], wpe[0])
    np.testing.assert_array_equal(single["ln_f"]["scale"], ln_f[0])

    ckpt = Checkpoints(str(tmp_path))
    assert runner.save(ckpt, 2, state)
    saved = to_canonical(ckpt.read_global(runner.plan), runner.plan)
    np.testing.assert_array_equal(saved["params/wpe"], wpe[0])
    np.testing.assert_array_equal(saved["params/ln_f/scale"], ln_f[0])
    want = to_canonical(jax.device_get(state), runner.plan)  # the oracle: pipe rank 0's copies
    assert saved.keys() == want.keys()
    for n in want:
        np.testing.assert_array_equal(saved[n], want[n], err_msg=n)
    restored = runner.restore(ckpt, runner.init_state())
    for copy in per_stage(restored.params["wpe"]):
        np.testing.assert_array_equal(copy, wpe[0])
