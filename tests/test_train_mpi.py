"""`jaxhc train --transport mpi` under `mpirun -np 8` against the XLA transport on 8 host devices.

A tiny GPT on the default 2 x 2 x 2 mesh, with a policy that compresses every message (zfp on
"data" and "pipe", mpc on "tensor"; min_bytes 0), for 3 steps, checkpointed after steps 2 and 3.

What must hold, and how exactly:
- The records are identical but for the measured timings, and so are the checkpointed states
  (parameters, AdamW moments, residuals; each rank wrote its own pieces), bit for bit: the
  collectives are bitwise XLA's (tests/test_mpi_transport.py), and the per-shard math, although
  compiled into two different XLA modules (one SPMD module with XLA's collectives, one module per
  process around mpi4jax's custom calls), rounds the same once the MPI transport's `axis_index` is
  as opaque to XLA's constant folding as SPMD's partition id (without that, 5 of 30 losses on this
  machine were 1 ulp off, from pipeline-stage branches folded away and fused differently).
- Resuming is bit-exact within a transport (XLA here, MPI in the slow test), and checkpoints cross
  transports (the MPI run's resumes on XLA) and meshes (slow: written by 2 ranks, resumed by 4
  and by 1, policy none: the next losses are XLA's on the new mesh from the same state).
- The fidelity samples (`train.fidelity_every`, steps 0 and 2) are in those identical records.
- A mesh that does not match `-np` ends the job with one line.
- A rank killed mid-run ends the job within a minute, naming the rank; the last checkpoint loads
  and the run resumes from it.
- A sharding plan that nests the data axis (`mesh.shard`) runs on sub-communicators and matches
  XLA the same way (its sampled fidelity within 1e-6).
"""

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
import mpi_helpers as h
import numpy as np
import pytest
from _canonical_oracle import from_canonical, on_mesh, to_canonical
from _gpt import assert_trees_equal

from jaxhc.data import Batches, corpus_bytes
from jaxhc.parallel.state import Plan
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import load
from jaxhc.train.loop import XlaRunner, run_loop, train

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "experiments" / "default.yaml"
TINY = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.block_size=16",
    "train.batch_size=8",
    "train.eval_batches=1",
    "train.ckpt_every=2",
    "optim.total_steps=3",
    "train.fidelity_every=2",  # steps 0 and 2 reduce their gradients a second time, exactly
]
# Data gradients with error feedback: their residuals travel through MPI checkpoints and resumes
# (the data psum_scatter is the fused call with residuals, tests/test_mpi_feedback.py; the pipe
# psum and param all_gather here are fused too).
POLICY = """\
name: every-message
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8, error_feedback: true}
  tensor: {codec: mpc, budget: 0.95}
  pipe: {codec: zfp, rate: 16}
"""
# Measured, so differ between runs; every other field of a record must be identical.
TIMING = ("seconds", "tokens_per_s", "model_tflops")
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]

pytestmark = pytest.mark.skipif(bool(h.mpi_ready()), reason=str(h.mpi_ready()))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "every-message.yaml"
    path.write_text(POLICY)
    return str(path)


def _overrides(policy: str, steps: int) -> list[str]:
    return TINY + [f"compression={policy}", f"train.steps={steps}"]


def _jaxhc() -> list[str]:
    script = Path(sys.executable).with_name("jaxhc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jaxhc.cli"]


def _train_command(np_: int, out: Path, overrides: list[str], resume=False):
    """`mpirun -np N jaxhc train --transport mpi ...` and its environment."""
    cmd = MPIRUN + ["-np", str(np_)] + _jaxhc()
    cmd += ["train", "--transport", "mpi", "--config", str(CONFIG), "--out", str(out)]
    cmd += ["--no-progress"] + (["--resume"] if resume else []) + overrides
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        OMPI_MCA_mpi_yield_when_idle="1",  # waiting ranks give the 2 cores to those computing
    )
    return cmd, env


def mpirun_train(np_: int, out: Path, overrides: list[str], *, resume=False, timeout=480):
    """`mpirun -np N jaxhc train --transport mpi ...`; returns (process, seconds). The limit is
    generous: 8 ranks compiling on 2 cores beside another test worker took over 240 s once."""
    cmd, env = _train_command(np_, out, overrides, resume)
    start = time.monotonic()
    # `timeout` ends mpirun (and so its ranks) even if this test's own timeout fires first.
    proc = subprocess.run(
        ["timeout", "-k", "10", str(timeout)] + cmd,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout + 30,
    )
    return proc, time.monotonic() - start


def records(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and k != "wire_bytes"}


def assert_same_records(got: list[dict], want: list[dict]) -> None:
    """Same steps, fields and values, bit for bit, but for the measured timings and the wire bytes.
    Wire bytes are what each transport moved: the MPI transport's fused collectives send MPC's
    used bytes (the XLA transport moves its static worst-case payload) plus 8-byte message headers,
    so where they report more at all it is by headers only."""
    assert [without_timing(r) for r in got] == [without_timing(r) for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["wire_bytes"].keys() == w["wire_bytes"].keys()
        for axis, wire in w["wire_bytes"].items():
            assert 0 < g["wire_bytes"][axis] <= 1.02 * wire + 64, axis


def host_checkpoint(run: Path, step: int, cfg):
    plan = Plan(cfg.model, cfg.mesh, cfg.optim, cfg.compression)
    return Checkpoints(str(run / "checkpoints")).read_global(plan, step)


def resume_copy(run: Path, dest: Path) -> Path:
    """A copy of `run` as if it had stopped after its checkpoint of step 2."""
    shutil.copytree(run, dest)
    shutil.rmtree(dest / "checkpoints" / "3")
    return dest


@pytest.fixture(scope="module")
def cfg(policy):
    return load(str(CONFIG), _overrides(policy, 3))


@pytest.fixture(scope="module")
def mpi_run(policy, tmp_path_factory):
    run = tmp_path_factory.mktemp("mpi") / "run"
    proc, took = mpirun_train(8, run, _overrides(policy, 3))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(f"{run}: step 3 loss") == 1, proc.stdout  # rank 0 alone reports
    print(f"\nmpirun -np 8, 3 steps: {took:.1f} s")
    return run


@pytest.fixture(scope="module")
def xla_run(cfg, tmp_path_factory):
    run = tmp_path_factory.mktemp("xla") / "run"
    summary = train(cfg, str(run), progress=False)
    assert summary == records(run)[-1] and "val_loss" in summary
    return run


def test_mpi_training_matches_xla(cfg, mpi_run, xla_run):
    mpi, xla = records(mpi_run), records(xla_run)
    print(f"\nlosses xla {[r['loss'] for r in xla]}\n       mpi {[r['loss'] for r in mpi]}")
    assert [r["step"] for r in mpi] == [0, 1, 2]
    assert_same_records(mpi, xla)
    assert mpi[-1]["wire_bytes"]["data"] < mpi[-1]["raw_bytes"]["data"]  # zfp did compress
    assert [("grad_rel_err" in r) + ("grad_cos" in r) for r in mpi] == [2, 0, 2]
    assert 0 < mpi[0]["grad_rel_err"] < 0.2 and 0.98 < mpi[0]["grad_cos"] < 1

    config = json.loads((mpi_run / "config.json").read_text())
    assert config["transport"] == "mpi" and len(config["devices"]) == 8
    assert config["policy"]["name"] == "every-message"

    assert sorted(os.listdir(mpi_run / "checkpoints")) == ["2", "3"]
    for step in (2, 3):  # parameters, AdamW moments, EF residuals, gathered from the ranks
        assert_trees_equal(host_checkpoint(mpi_run, step, cfg), host_checkpoint(xla_run, step, cfg))
    residual = np.asarray(host_checkpoint(mpi_run, 3, cfg).opt_state["residual"])
    assert residual.shape[:2] == (2, 2) and residual.any()


def test_an_mpi_checkpoint_resumes_on_xla(cfg, mpi_run, xla_run, tmp_path):
    run = resume_copy(mpi_run, tmp_path / "mpi-then-xla")
    train(cfg, str(run), resume=True, progress=False)
    assert_same_records(records(run), records(xla_run))
    assert_trees_equal(host_checkpoint(run, 3, cfg), host_checkpoint(xla_run, 3, cfg))


def test_xla_resume_is_bit_exact(cfg, xla_run, tmp_path):
    run = resume_copy(xla_run, tmp_path / "xla-resumed")
    train(cfg, str(run), resume=True, progress=False)
    assert_same_records(records(run), records(xla_run))
    assert_trees_equal(host_checkpoint(run, 3, cfg), host_checkpoint(xla_run, 3, cfg))


def test_a_mesh_that_does_not_match_np_is_one_line(tmp_path):
    proc, took = mpirun_train(2, tmp_path / "run", TINY + ["train.steps=1"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    line = (
        "jaxhc train: error: mesh data x tensor x pipe = 2 x 2 x 2 = 8 but the MPI job has 2 "
        "processes: start it with `mpirun -np 8`"
    )
    assert out.count("jaxhc train: error:") == 1 and line in out, out
    assert "Traceback" not in out, out
    assert not (tmp_path / "run").exists()
    assert took < 60, took


@pytest.mark.slow
def test_mpi_resume_is_bit_exact(policy, cfg, mpi_run, tmp_path):
    """Resume after 2 of 3 steps under MPI: step 3 is the uninterrupted MPI run's, bit for bit."""
    run = resume_copy(mpi_run, tmp_path / "mpi-resumed")
    proc, _ = mpirun_train(8, run, _overrides(policy, 3))  # no --resume: refused, in one line
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert out.count("jaxhc train: error:") == 1 and "already holds a run" in out, out

    proc, took = mpirun_train(8, run, _overrides(policy, 3), resume=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"\nmpirun -np 8 --resume, 1 step: {took:.1f} s")
    assert_same_records(records(run), records(mpi_run))
    assert_trees_equal(host_checkpoint(run, 3, cfg), host_checkpoint(mpi_run, 3, cfg))


def _mesh(d: int, t: int, p: int) -> list[str]:
    micro = 2 if p > 1 else 1
    return [f"mesh.data={d}", f"mesh.tensor={t}", f"mesh.pipe={p}", f"mesh.microbatches={micro}"]


@pytest.mark.slow  # three mpirun jobs: about 4 minutes on 2 cores
def test_an_mpi_checkpoint_resumes_on_other_meshes(tmp_path):
    """Policy none, 4 steps: written by `mpirun -np 2` on 1 x 1 x 2 (two pipeline stages),
    resumed after step 2 by `mpirun -np 4` on 4 x 1 x 1 and by `mpirun -np 1`: steps 2 and 3 are
    what the XLA transport computes on the new mesh from the same state (placed there by the
    whole-array oracle), within 1e-6."""
    common = TINY + ["compression=none", "train.steps=4", "optim.total_steps=4"]
    written = tmp_path / "np2"
    proc, _ = mpirun_train(2, written, common + _mesh(1, 1, 2))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = load(str(CONFIG), common + _mesh(1, 1, 2))
    plan = Plan(cfg.model, cfg.mesh, cfg.optim)
    canon = to_canonical(Checkpoints(str(written / "checkpoints")).read_global(plan, 2), plan)
    batches = Batches(corpus_bytes(), cfg.train.batch_size, cfg.model.block_size, cfg.train.seed)
    for np_, shape in ((4, (4, 1, 1)), (1, (1, 1, 1))):
        run = tmp_path / f"np{np_}"
        shutil.copytree(written, run)
        shutil.rmtree(run / "checkpoints" / "4")
        proc, took = mpirun_train(np_, run, common + _mesh(*shape), resume=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = [r["loss"] for r in records(run)]
        assert [r["step"] for r in records(run)] == [0, 1, 2, 3]

        runner = XlaRunner(load(str(CONFIG), common + _mesh(*shape)), jax.devices()[:np_])
        state = on_mesh(from_canonical(canon, runner.plan), runner)
        want = []
        for i in (2, 3):
            state, metrics = runner.step(state, batches.train(i))
            want.append(float(metrics["loss"]))
        print(f"\n-np 2 then -np {np_} ({took:.0f} s): {got}; XLA from the same state: {want}")
        np.testing.assert_allclose(got[2:], want, rtol=0, atol=1e-6)
        assert got[:2] == [r["loss"] for r in records(written)][:2]


def _rank_pid(mpirun: int, rank: int) -> int | None:
    """The process id of MPI rank `rank` among mpirun's children (read from their environment)."""
    children = Path(f"/proc/{mpirun}/task/{mpirun}/children")
    for pid in children.read_text().split() if children.exists() else []:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # it has just ended
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return int(pid)
    return None


@pytest.mark.slow  # CI time: tests/test_mpi_launch.py ends a job whose rank is killed
def test_a_rank_killed_mid_run_ends_the_job_and_the_last_checkpoint_resumes(policy, tmp_path):
    """`mpirun -np 2 jaxhc train`, data=2; once checkpoint 2 exists, rank 1 is SIGKILLed (in a step
    or while rank 0 writes a checkpoint). mpirun ends the job naming rank 1 within a minute; the
    latest complete checkpoint loads and `--resume` (here on the XLA transport) continues from
    it, the metrics truncated to the steps before it."""
    run = tmp_path / "run"
    overrides = _overrides(policy, 200) + ["mesh.data=2", "mesh.tensor=1", "mesh.pipe=1"]
    cmd, env = _train_command(2, run, overrides)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 180
        while not (run / "checkpoints" / "2").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out = proc.communicate(timeout=120)[0]
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, out
    assert "process rank 1 with PID" in out and "signal 9" in out, out
    assert took < 60, took

    latest = Checkpoints(str(run / "checkpoints")).latest_step()
    assert latest is not None and latest >= 2 and latest % 2 == 0
    cfg = load(str(CONFIG), [*overrides, f"train.steps={latest + 1}"])
    runner = XlaRunner(cfg, jax.devices()[:2])  # this process has 8 devices; the mesh needs 2
    summary = run_loop(cfg, str(run), runner, resume=True, progress=False)
    assert summary["step"] == latest and np.isfinite(summary["loss"])
    assert [r["step"] for r in records(run)] == list(range(latest + 1))


NESTED_POLICY = """\
name: data-{name}
min_bytes: 0
axes:
  data: {codec}
"""


@pytest.mark.parametrize(
    "shard, codec",
    [
        # CI time: all under `slow`; the MPI suite (`make test`'s `mpirun -np 4`) trains nested
        # plans with sharded parameters on sub-communicators against XLA (tests/test_keep_mpi.py,
        # tests/test_prefetch_mpi.py: data 4 as groups of 2)
        pytest.param((1, 1, 2), "zfp:8", id="optim2", marks=pytest.mark.slow),
        pytest.param((2, 2, 4), "zfp:8", id="params2-optim4", marks=pytest.mark.slow),
        # Known: with q8 the records match but the step-2 optimizer state differs from XLA's
        # by 1 ulp in some blocks, fused or not (the unfused algorithm gives the same bytes).
        pytest.param(
            (2, 2, 4),
            "q8",
            id="params2-optim4-q8",
            marks=[
                pytest.mark.slow,
                pytest.mark.xfail(
                    strict=True, raises=AssertionError, reason="q8 optimizer state 1 ulp off XLA's"
                ),
            ],
        ),
    ],
)
def test_a_nested_sharding_plan_under_mpi_matches_xla(shard, codec, tmp_path):
    """4 x 1 x 1 under `mpirun -np 4` (CI time: the tensor axis under MPI is the shared run's)
    with the data axis as sub-axes data.0 x data.1 (each a communicator of its own under MPI),
    zfp (or q8) on them: the optimizer state split over groups of 2 data ranks and the
    gradients all-reduced (shard 1, 1, 2), or the parameters sharded too (ZeRO-3 within groups of
    2, optimizer over all 4: shard 2, 2, 4; rank 0 alone builds and scatters the state). Records
    and checkpoints are XLA's, bit for bit, but for the sampled fidelity of step 2 (a measurement
    outside training, within 1e-6: the two modules sum its squares in differently fused orders
    there)."""
    name = codec.split(":")[0]
    policy = tmp_path / f"data-{name}.yaml"
    policy.write_text(NESTED_POLICY.format(name=name, codec=codec))
    overrides = _overrides(str(policy), 3) + _mesh(4, 1, 1)
    params, grads, optim = shard
    overrides += [f"mesh.shard.params={params}", f"mesh.shard.grads={grads}"]
    overrides += [f"mesh.shard.optim={optim}"]
    if params > 1:  # sharded parameters hold no local gradients to sample fidelity from
        overrides += ["train.fidelity_every=0"]
    run = tmp_path / "mpi"
    proc, took = mpirun_train(4, run, overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"\nmpirun -np 4, nested plan, 3 steps: {took:.1f} s")
    cfg = load(str(CONFIG), overrides)
    xla_runner = XlaRunner(cfg, jax.devices()[:4])
    run_loop(cfg, str(tmp_path / "xla"), xla_runner, resume=False, progress=False)
    mpi, xla = records(run), records(tmp_path / "xla")
    fidelity = ("grad_rel_err", "grad_cos")
    for got, want in zip(mpi, xla, strict=True):
        for key in set(fidelity) & set(want):
            assert got.pop(key) == pytest.approx(want.pop(key), rel=1e-6, abs=0), key
    assert_same_records(mpi, xla)
    assert mpi[-1]["wire_bytes"]["data.1"] < mpi[-1]["raw_bytes"]["data.1"]
    for step in (2, 3):
        assert_trees_equal(
            host_checkpoint(run, step, cfg), host_checkpoint(tmp_path / "xla", step, cfg)
        )
