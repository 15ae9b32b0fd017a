"""Faults a run must survive: a process killed while it writes a checkpoint, a corrupted
checkpoint file, and non-finite gradients. (Ranks killed mid-job: tests/test_mpi_launch.py and
tests/test_train_mpi.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_train
from _canonical_oracle import coords_of, from_canonical
from _gpt import assert_trees_equal
from _tiers import quick
from checkpoint_job import BIG, big_state, blocks
from test_checkpoint import MODEL, OPTIM, random_canonical
from test_train_mpi import host_checkpoint

import jaxhc
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import zero
from jaxhc.parallel.state import Plan
from jaxhc.policy import Policy
from jaxhc.train.checkpoint import META, Checkpoints, all_finite
from jaxhc.train.config import load
from jaxhc.train.loop import XlaRunner, run_loop

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).with_name("checkpoint_job.py")
# test_train's tiny model on a 2 x 1 x 1 mesh (2 host devices: quick to compile in a new process)
TINY = [*test_train.TINY, "mesh.data=2", "mesh.tensor=1", "mesh.pipe=1"]


def jaxhc_train(*args, timeout=300):
    """`jaxhc train` of the tiny model in a new process (it sets its own 2 host devices)."""
    return _run(
        [sys.executable, "-m", "jaxhc.cli", "train", "--no-progress", *args, *TINY], timeout
    )


def _run(cmd, timeout):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# --- killed while writing a checkpoint ------------------------------------------------------------


def test_a_save_killed_mid_write_leaves_the_previous_checkpoint_latest(tmp_path):
    """SIGKILL while step 2 (~100 MB) is being written (its temporary directory exists): step 1
    stays the latest and loads bit-exactly, and step 2 can then be saved over the debris."""
    directory = tmp_path / "checkpoints"
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "big", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (directory / ".tmp-2").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "saved 1" in out and "saved 2" not in out, out
    assert not (directory / "2").exists(), "the save finished before the kill: nothing was tested"

    checkpoints = Checkpoints(str(directory))
    assert checkpoints.latest_step() == 1
    assert_trees_equal(checkpoints.read_global(BIG, 1), big_state(1))
    assert checkpoints.save(2, BIG, blocks(big_state(2), BIG)) and checkpoints.latest_step() == 2
    assert sorted(os.listdir(directory)) == ["1", "2"]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A run SIGKILLed after every piece of its step-4 checkpoint was written but before it was
    committed, then resumed with `jaxhc train --resume`."""
    run = tmp_path_factory.mktemp("killed") / "run"
    proc = _run([sys.executable, str(JOB), "train", str(run), *TINY], 300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGKILL, out
    assert (run / "checkpoints" / ".tmp-4").exists() and not (run / "checkpoints" / "4").exists()
    assert Checkpoints(str(run / "checkpoints")).latest_step() == 2

    proc = jaxhc_train("--out", str(run), "--steps", "4", "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def test_a_run_killed_before_its_checkpoint_was_committed_resumes_from_the_one_before(
    resumed_run,
):
    assert [r["step"] for r in _records(resumed_run)] == [0, 1, 2, 3]
    checkpoints = Checkpoints(str(resumed_run / "checkpoints"))
    assert checkpoints.steps() == [2, 4]
    assert checkpoints.verify(4) is None
    assert sorted(os.listdir(resumed_run / "checkpoints")) == ["2", "4"]  # the debris is gone


# --- corrupted checkpoints ------------------------------------------------------------------------


def _largest(step_dir: Path) -> Path:
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != META]
    return max(files, key=lambda p: p.stat().st_size)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _extra(step_dir: Path) -> Path:
    extra = _largest(step_dir).with_name("9.9")
    extra.write_bytes(b"\0" * 64)
    return extra


CORRUPTIONS = {
    "flipped-bit": (_largest, _flip, "is corrupt: its bytes differ from when written"),
    "truncated": (_largest, _truncate, "bytes, "),
    "metadata": (lambda d: d / META, _flip, "is corrupt: "),
    "deleted": (_largest, Path.unlink, "is missing"),
    "extra": (_extra, lambda p: None, "was not part of the save"),
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupted_checkpoint_is_refused_naming_the_file(how, tmp_path):
    """Each corruption of the newest step: restore raises one line naming the file and the
    intact step before it; no file changes; that step still loads."""
    directory = tmp_path / "checkpoints"
    plan = Plan(MODEL, MeshConfig(data=2, tensor=1, pipe=2, microbatches=2), OPTIM)
    states = {s: from_canonical(random_canonical(plan, s), plan) for s in (1, 2)}
    checkpoints = Checkpoints(str(directory))
    for step, state in states.items():
        assert checkpoints.save(step, plan, blocks(state, plan))

    pick, corrupt, what = CORRUPTIONS[how]
    victim = pick(directory / "2")
    corrupt(victim)
    before = _tree_bytes(directory)
    checkpoints = Checkpoints(str(directory))
    with pytest.raises(ValueError) as e:
        list(checkpoints.restore(plan, coords_of(plan.mesh_cfg)))
    message = str(e.value)
    assert "\n" not in message and f"checkpoint file {victim} " in message, message
    assert what in message, message
    assert f"step 1 is the newest intact checkpoint: delete {directory / '2'}" in message
    assert_trees_equal(checkpoints.read_global(plan, 1), states[1])
    assert _tree_bytes(directory) == before


def test_resume_from_a_corrupted_checkpoint_is_one_line_and_overwrites_nothing(
    resumed_run, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(resumed_run, run)
    victim = _largest(run / "checkpoints" / "4")
    _flip(victim)
    before = _tree_bytes(run)
    proc = jaxhc_train("--out", str(run), "--steps", "6", "--resume")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"jaxhc train: error: checkpoint file {victim} is corrupt"), err
    assert "\n" not in err and "step 2 is the newest intact checkpoint" in err, err
    assert _tree_bytes(run) == before


# --- a NaN storm: one rank's gradients non-finite for several steps -------------------------------


def _lossy_data_policies() -> dict[str, str]:
    """One shipped policy per distinct lossy codec of the "data" axis (which carries the
    gradients here): every lossy preset is one of these on a data-only mesh."""
    chosen: dict[tuple, str] = {}
    for path in sorted((ROOT / "configs" / "policy").glob("*.yaml")):
        policy = Policy.load(str(path))
        codec = policy.codec_for("data", "grad")
        if codec is not None and not codec.lossless:
            chosen.setdefault((codec.spec, policy.error_feedback("data")), path.stem)
    return {name: name for name in sorted(chosen.values())}


def _storm(first: int, steps: int, monkeypatch) -> None:
    """Data rank 1's gradients are +Inf at step `first` and NaN at the `steps - 1` after it, as
    they enter the data-parallel reduction (the per-shard step and `zero.reduce` are wrapped; the
    product code is unchanged)."""
    from jaxhc.parallel import step as step_module

    reduce, make = zero.reduce, step_module.per_shard_train_step
    now = {}

    def per_shard(*args, **kwargs):
        inner = make(*args, **kwargs)

        def step(state, tokens):
            now["step"] = state.step  # read by `poisoned` below, in the same trace
            return inner(state, tokens)

        return step

    def poisoned(grads, *args):
        step = now["step"]
        storm = (jaxhc.axis_index("data") == 1) & (step >= first) & (step < first + steps)
        bad = jnp.where(step == first, jnp.inf, jnp.nan)
        grads = jax.tree.map(lambda g: jnp.where(storm, bad.astype(g.dtype), g), grads)
        return reduce(grads, *args)

    monkeypatch.setattr(step_module, "per_shard_train_step", per_shard)
    monkeypatch.setattr(zero, "reduce", poisoned)


def _train_in_process(run: Path, policy: str, tmp_path, *extra: str) -> dict:
    cfg = load(None, [*TINY, "train.steps=6", f"compression={policy}", *extra])
    runner = XlaRunner(cfg, jax.devices()[:2])  # this process has 8 devices; the mesh needs 2
    return cfg, run_loop(cfg, str(run), runner, resume=False, progress=False)


# The quick suite: one codec of each family (q8; zfp with error feedback; q4:h with error
# feedback, its own scale choice); every lossy preset under `slow`.
@pytest.mark.parametrize("preset", quick(list(_lossy_data_policies()), {"zfp8_ef"}))
def test_a_nan_storm_is_skipped_on_every_rank_and_never_encoded(preset, tmp_path, monkeypatch):
    """Steps 2 and 3 with Inf / NaN gradients on data rank 1: both fall back to raw (the lossy
    codec never encodes them), both are skipped on every rank, and the state after the storm is
    the state before it, bit for bit (parameters, moments, master copy, residuals); training
    then goes on compressed."""
    _storm(2, 2, monkeypatch)
    policy = test_train.every_message(preset, tmp_path)
    cfg, _ = _train_in_process(tmp_path / "run", policy, tmp_path)
    records = _records(tmp_path / "run")
    assert [r["skipped"] for r in records] == [False, False, True, True, False, False]
    for r in records:
        storm = r["step"] in (2, 3)
        assert (r["fallbacks"]["data"] > 0) == storm, r
        assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) != storm, r
    before, after = (
        host_checkpoint(tmp_path / "run", 2, cfg),
        host_checkpoint(tmp_path / "run", 4, cfg),
    )
    assert int(after.step) == 4
    kept = (before.params, before.opt_state), (after.params, after.opt_state)
    for a, b in zip(*map(jax.tree.leaves, kept), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_storm_longer_than_max_skipped_steps_stops_in_one_line(tmp_path, monkeypatch):
    """Steps 2, 3 and 4 non-finite with train.max_skipped_steps=2: the run stops at step 4; its
    checkpoints are step 2 and step 4 (the state of step 2, kept through the skipped steps)."""
    _storm(2, 3, monkeypatch)
    policy = test_train.every_message("zhybrid_ef", tmp_path)
    with pytest.raises(FloatingPointError) as e:
        _train_in_process(tmp_path / "run", policy, tmp_path, "train.max_skipped_steps=2")
    assert str(e.value) == (
        "steps 2-4: gradients not finite 3 times in a row (train.max_skipped_steps=2); "
        "stopping with the state before step 2 (checkpoints kept)"
    )
    assert [r["skipped"] for r in _records(tmp_path / "run")] == [False, False, True, True]
    assert Checkpoints(str(tmp_path / "run" / "checkpoints")).steps() == [2, 4]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "4"]


def test_a_non_finite_state_is_never_checkpointed(tmp_path):
    plan = Plan(MODEL, MeshConfig(data=2, tensor=1, pipe=1), OPTIM)
    state = from_canonical(random_canonical(plan, 1), plan)
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"))
    assert checkpoints.save(1, plan, blocks(state, plan))
    for bad in (np.nan, np.inf):
        master = state.opt_state["master"].copy()
        master.flat[3] = bad
        poisoned = state.replace(opt_state={**state.opt_state, "master": master})
        finite = checkpoints.save(2, plan, blocks(poisoned, plan), finite=all_finite(poisoned))
        assert not finite
    assert checkpoints.steps() == [1]
    assert os.listdir(tmp_path / "checkpoints") == ["1"]
