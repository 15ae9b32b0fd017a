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

import numpy as np
import pytest
import test_train
from checkpoint_job import big_state

from jaxhc.train.checkpoint import MANIFEST, Checkpoints

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
    """SIGKILL while Orbax writes step 2 (128 MB; its temporary directory exists): step 1 stays
    the latest and loads bit-exactly, and step 2 can then be saved over the debris."""
    directory = tmp_path / "checkpoints"
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "big", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith("2.") for p in directory.glob("*")):
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
    try:
        assert checkpoints.latest_step() == 1
        got = checkpoints.restore(big_state(1))
        np.testing.assert_array_equal(np.asarray(got["w"]), big_state(1)["w"])
        assert checkpoints.save(2, big_state(2)) and checkpoints.latest_step() == 2
    finally:
        checkpoints.close()


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A run SIGKILLed after Orbax wrote its step-4 checkpoint but before jaxhc verified it, then
    resumed with `jaxhc train --resume`."""
    run = tmp_path_factory.mktemp("killed") / "run"
    proc = _run([sys.executable, str(JOB), "train", str(run), *TINY], 300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGKILL, out
    assert (run / "checkpoints" / "4").exists() and not (
        run / "checkpoints" / "4" / MANIFEST
    ).exists()
    checkpoints = Checkpoints(str(run / "checkpoints"))
    assert checkpoints.latest_step() == 2
    checkpoints.close()

    proc = jaxhc_train("--out", str(run), "--steps", "4", "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def test_a_run_killed_before_its_checkpoint_was_verified_resumes_from_the_one_before(resumed_run):
    assert [r["step"] for r in _records(resumed_run)] == [0, 1, 2, 3]
    checkpoints = Checkpoints(str(resumed_run / "checkpoints"))
    try:
        assert checkpoints.steps() == [2, 4]
        assert checkpoints.verify(4) is None  # the killed save's debris was replaced
    finally:
        checkpoints.close()


# --- corrupted checkpoints ------------------------------------------------------------------------


def _largest(step_dir: Path) -> Path:
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "flipped-bit": (_largest, _flip, "its bytes differ from when written"),
    "truncated": (_largest, _truncate, "bytes, "),
    "metadata": (lambda d: d / "_CHECKPOINT_METADATA", _flip, "its bytes differ"),
    "deleted": (_largest, Path.unlink, "is missing"),
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupted_checkpoint_is_refused_naming_the_file(how, tmp_path):
    """Each corruption of the newest step: restore raises one line naming the file and the
    intact step before it; no file changes; that step still loads."""
    directory = tmp_path / "checkpoints"
    rng = np.random.default_rng(0)
    states = {s: {"w": rng.standard_normal(1 << 16).astype(np.float32)} for s in (1, 2)}
    checkpoints = Checkpoints(str(directory))
    for step, state in states.items():
        assert checkpoints.save(step, state)
    checkpoints.close()

    pick, corrupt, what = CORRUPTIONS[how]
    victim = pick(directory / "2")
    corrupt(victim)
    before = _tree_bytes(directory)
    checkpoints = Checkpoints(str(directory))
    try:
        with pytest.raises(ValueError) as e:
            checkpoints.restore(states[1])
        message = str(e.value)
        assert "\n" not in message and f"checkpoint file {victim} is " in message, message
        assert what in message, message
        assert f"step 1 is the newest intact checkpoint: delete {directory / '2'}" in message
        got = checkpoints.restore(states[1], step=1)
        np.testing.assert_array_equal(np.asarray(got["w"]), states[1]["w"])
    finally:
        checkpoints.close()
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
