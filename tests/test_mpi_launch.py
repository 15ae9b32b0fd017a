"""The launcher in one process (env parsing, blocks, the XLA path) and multi-process jobs as
subprocesses: a rank that raises, a rank SIGKILLed mid-job and mismatched shapes must end the job
quickly, with a message naming the rank; `jax.distributed` on 127.0.0.1 runs the XLA transport
over two processes, and ends in bounded time, naming the task, when one of them is killed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import mpi_helpers as h
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import partition
from jaxhc.launch import ProcessEnv, first_host

JOB = Path(__file__).with_name("mpi_job.py")
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]


# --- environment ---------------------------------------------------------------------------------


def test_process_env_from_mpirun_slurm_jaxhc_and_single():
    ompi = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
    }
    env = ProcessEnv.from_env(ompi)
    assert (env.process_id, env.num_processes, env.local_rank, env.local_size) == (2, 4, 0, 2)
    assert env.source == "mpirun" and env.coordinator == "10.96.0.1:62624"
    single_node = dict(ompi, OMPI_COMM_WORLD_LOCAL_SIZE="4")
    assert ProcessEnv.from_env(single_node, port=5000).coordinator == "127.0.0.1:5000"

    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "node[003-004,010],gpu7",
        "SLURM_JOB_ID": "77",
        "SLURM_NTASKS_PER_NODE": "4(x2)",
    }
    env = ProcessEnv.from_env(slurm)
    assert (env.process_id, env.num_processes, env.local_rank, env.source) == (5, 8, 1, "slurm")
    assert env.coordinator == "node003:61517" and env.local_size == 4

    mine = {"JAXHC_NUM_PROCESSES": "2", "JAXHC_PROCESS_ID": "1", "JAXHC_COORDINATOR": "h:9"}
    env = ProcessEnv.from_env(dict(mine, **ompi))  # jaxhc's own variables win
    assert (env.process_id, env.num_processes, env.coordinator, env.source) == (
        1,
        2,
        "h:9",
        "jaxhc",
    )
    assert ProcessEnv.from_env({}) == ProcessEnv(0, 1, 0, 1, None, "single")


@pytest.mark.parametrize(
    ("nodes", "first"),
    [("a01", "a01"), ("a01,b02", "a01"), ("gpu[07-09,12]", "gpu07"), ("n[5],m[1-2]", "n5")],
)
def test_first_host(nodes, first):
    assert first_host(nodes) == first


def test_auto_transport_is_xla_in_one_process():
    assert jaxhc.launch.resolve_transport("auto") == "xla"
    with pytest.raises(ValueError, match="transport"):
        jaxhc.launch.resolve_transport("nccl")


# --- blocks: a rank's block must be the shard jax gives device r of the same mesh ---------------


@pytest.mark.parametrize("shape", [(4,), (2, 2), (1, 2, 2), (2, 1, 4)], ids=h.mesh_id)
def test_blocks_match_jax_shardings(shape):
    mesh_shape = h.mesh_shape(shape)
    names = tuple(mesh_shape)
    launcher = jaxhc.Launcher(mesh_shape, "xla")
    x = np.arange(8 * 8 * 4).reshape(8, 8, 4)
    specs = [P(), P(names[0]), P(None, names[-1]), P(tuple(reversed(names))), P(None, names)]
    for spec in specs:
        index = NamedSharding(launcher.mesh, spec).devices_indices_map(x.shape)
        blocks, coords = [], []
        for r, device in enumerate(launcher.mesh.devices.reshape(-1)):
            c = dict(zip(names, np.unravel_index(r, shape), strict=True))
            block = partition.local_block(spec, x, c, mesh_shape)
            np.testing.assert_array_equal(block, x[index[device]])
            blocks.append(block)
            coords.append(c)
        np.testing.assert_array_equal(partition.assemble(spec, blocks, coords, mesh_shape), x)


def test_block_errors_are_clear():
    with pytest.raises(ValueError, match="does not split evenly"):
        partition.block_slices(P("data"), (3,), {"data": 0}, {"data": 2})
    with pytest.raises(ValueError, match="not in the mesh"):
        partition.block_slices(P("model"), (4,), {"data": 0}, {"data": 2})


# --- the XLA path of the entry point ------------------------------------------------------------


def test_run_xla_matches_numpy_and_keeps_small_odd_sizes():
    x = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    for codec in (None, "none", h.FiniteIdentity()):

        def body(a, codec=codec):
            return jaxhc.psum(a, "data", codec=codec)

        out = jaxhc.run(
            body,
            x,
            mesh_shape={"data": 2},
            in_specs=P("data"),
            out_specs=P(),
            transport="xla",
            fetch=True,
        )
        np.testing.assert_array_equal(out, x.sum(0, keepdims=True))


def test_launcher_step_takes_placed_values_and_host_arrays():
    launcher = jaxhc.Launcher({"data": 2, "tensor": 2}, "xla")
    spec = P("data", "tensor")

    def body(a):
        return jaxhc.all_gather(a, "tensor", axis=1, tiled=True)

    step = launcher.shard_map(body, in_specs=spec, out_specs=P("data"))
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    placed = launcher.put(x, spec)
    assert placed.sharding == NamedSharding(launcher.mesh, spec)
    np.testing.assert_array_equal(launcher.fetch(step(placed), P("data")), x)
    np.testing.assert_array_equal(launcher.fetch(step(x), P("data")), x)


def test_mesh_bigger_than_the_devices_is_an_error():
    with pytest.raises(ValueError, match="needs 64 devices"):
        jaxhc.Launcher({"data": 64}, "xla")


# --- multi-process jobs (subprocesses with timeouts) ----------------------------------------------


def _mpirun(np_, mode, timeout=90):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    start = time.monotonic()
    proc = subprocess.run(
        MPIRUN + ["-np", str(np_), sys.executable, str(JOB), mode],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - start


needs_mpi = pytest.mark.skipif(bool(h.mpi_ready()), reason=str(h.mpi_ready()))


@needs_mpi
def test_a_rank_that_raises_ends_the_job_with_its_message():
    proc, took = _mpirun(2, "raise")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rank 1 of 2 raised; aborting the MPI job" in out, out
    assert "ValueError: boom from rank 1" in out, out
    assert "should have been aborted" not in out, out
    assert took < 60, took


@needs_mpi
def test_mismatched_shapes_end_the_job_with_both_shapes():
    proc, took = _mpirun(2, "mismatch")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "RankMismatchError: ranks disagree on the arguments of body" in out, out
    assert "rank 0: PyTreeDef((*,)) [float32[1, 6]]" in out, out
    assert "rank 1: PyTreeDef((*,)) [float32[1, 4]]" in out, out
    assert "with mismatched shapes" not in out, out
    assert took < 60, took


@needs_mpi
def test_a_mesh_that_does_not_fit_the_job_says_so():
    proc, took = _mpirun(2, "badmesh")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "the mesh {'data': 4} has 4 devices but the MPI job has 2 processes" in out, out
    assert took < 60, took


@needs_mpi
def test_a_good_job_exits_zero():
    proc, _ = _mpirun(2, "ok")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0 ok [[6.0, 8.0, 10.0, 12.0, 14.0, 16.0]]" in out, out
    assert "rank 1 ok [[6.0, 8.0, 10.0, 12.0, 14.0, 16.0]]" in out, out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distributed(mode, timeout=120):
    """Two processes x 2 CPU devices (gloo) started by JAXHC_* variables, running `mode` of
    tests/mpi_job.py; returns the processes, their outputs and the seconds until both ended."""
    port = _free_port()
    procs = []
    start = time.monotonic()
    for pid in range(2):
        env = dict(
            os.environ,
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
            JAXHC_NUM_PROCESSES="2",
            JAXHC_PROCESS_ID=str(pid),
            JAXHC_COORDINATOR=f"127.0.0.1:{port}",
        )
        for k in [k for k in env if k.startswith(("OMPI_", "PMIX_", "SLURM_"))]:
            del env[k]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(JOB), mode],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, outs, time.monotonic() - start


def test_jax_distributed_two_processes_on_localhost():
    """The XLA transport over 2 processes x 2 CPU devices (gloo), started by JAXHC_* variables."""
    procs, outs, _ = _distributed("distributed")
    for pid, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, out
        assert f"process {pid} distributed ok [[18.0, 22.0, 26.0]]" in out, out


# --- a process killed mid-job ---------------------------------------------------------------------


@needs_mpi
def test_a_rank_killed_mid_job_ends_it_naming_the_rank():
    """Rank 1 is SIGKILLed while rank 0 waits for it in a psum: mpirun ends the job and names it."""
    proc, took = _mpirun(2, "die")
    out = proc.stdout + proc.stderr
    assert "rank 1 stepped once" in out, out
    assert proc.returncode != 0, out
    assert "process rank 1 with PID" in out and "signal 9" in out, out
    assert "kept stepping" not in out, out
    assert took < 60, took


@pytest.mark.slow  # CI time: the quick suite kills the coordinator and an MPI rank
def test_a_jax_distributed_peer_killed_mid_job_ends_it_naming_the_task():
    """Process 1 is SIGKILLed while process 0 waits for it in a psum (gloo): jax's coordination
    service misses its heartbeats and ends process 0 with a message naming task 1, after the
    heartbeat timeout `init_distributed` sets (10 s here, 30 s by default; jax's own is 100 s)."""
    procs, (out0, out1), took = _distributed("distributed-die1")
    assert "process 1 distributed ok" in out1, out1
    assert procs[1].returncode == -9, out1
    assert "process 0 distributed ok" in out0, out0
    assert procs[0].returncode != 0, out0
    # jax's service names it either way, whichever of its checks sees the silence first
    assert re.search(r"Task 1 heartbeat timeout|stopped sending heartbeats\):\s*1\n", out0), out0
    assert "kept stepping" not in out0, out0
    assert took < 60, took


def test_a_killed_jax_distributed_coordinator_ends_the_others_at_once():
    """Process 0 (it hosts the coordination service) is SIGKILLed: process 1 loses the service's
    connection and ends at once, saying that another task died."""
    procs, (out0, out1), took = _distributed("distributed-die0")
    assert "process 0 distributed ok" in out0, out0
    assert procs[0].returncode == -9, out0
    assert procs[1].returncode != 0, out1
    assert "the JAX distributed service detected fatal errors" in out1, out1
    assert "kept stepping" not in out1, out1
    assert took < 60, took


# --- collectives fixes found by comparing the transports ------------------------------------------


def test_compressed_ppermute_over_a_reversed_axis_tuple_matches_lax():
    """lax.ppermute numbers a tuple of axes in mesh order; the compressed path must too."""
    from jax import lax

    launcher = jaxhc.Launcher({"data": 2, "tensor": 2}, "xla")
    spec = P(("data", "tensor"))
    axes = ("tensor", "data")

    def body(x):
        perm = [(0, 1), (1, 3)]
        return lax.ppermute(x, axes, perm), jaxhc.ppermute(x, axes, perm, codec="none")

    step = launcher.shard_map(body, in_specs=spec, out_specs=(spec, spec))
    want, got = launcher.fetch(step(np.arange(1.0, 5.0, dtype=np.float32)), (spec, spec))
    np.testing.assert_array_equal(got, want)
    assert want.tolist() == [0.0, 1.0, 0.0, 2.0]
