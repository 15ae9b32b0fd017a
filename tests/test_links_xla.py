"""The XLA transport across network-namespace hosts (bench/links, no mpirun): one process per host
forms a jax.distributed job, coordinator on host 0's address, gloo on each host's own.

Needs root and network namespaces (skipped with the reason otherwise). Each host is its own network
namespace with its own host name, which resolves nowhere: gloo works there only because
`init_distributed` passes the host's address (JAXHC_GLOO_HOSTNAME) to jaxlib's gloo collectives.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import links_job
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_distributed import clean_env, records, same_run
from test_train import TINY, every_message

import jaxhc
from bench.links import Cluster, ClusterError, check_available, namespaces

ROOT = Path(__file__).resolve().parents[1]
JAXHC = [sys.executable, "-m", "jaxhc.cli", "train", "--no-progress"]
# In each host: one CPU device, no inherited device count (conftest sets 8 for this process).
ONE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
MESH = ["--mesh", "data=2,tensor=1,pipe=1"]


def _why_not() -> str | None:
    try:
        check_available()
    except ClusterError as e:
        return f"no namespace hosts here: {e}"
    return None


needs_cluster = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@needs_cluster
@pytest.mark.timeout(120)
def test_psum_across_two_namespace_hosts_equals_one_process(tmp_path):
    """1 MiB psums (plain and zfp:8) through XLA's collectives across two jax.distributed
    processes in two namespace hosts: the bytes of the same psum on two devices of this process."""
    out = tmp_path / "psum.npz"
    with Cluster(hosts=2, rate="1gbit") as cluster:
        job = [sys.executable, str(ROOT / "tests" / "links_job.py"), str(out), "xla"]
        cluster.run_distributed(job, timeout=100, env=ONE)
        made = [cluster.bridge, *cluster.names]
    assert not set(made) & set(namespaces())
    got = np.load(out)
    launcher = jaxhc.Launcher({"x": 2}, "xla")
    x = launcher.put(links_job.data(), P("x"))
    for key, step in links_job.steps(launcher).items():
        want = launcher.fetch(step(x), P())
        assert got[key].tobytes() == want.tobytes(), f"codec {key}: across hosts != one process"


@needs_cluster
@pytest.mark.timeout(300)
@pytest.mark.slow  # CI time (~90 s): the quick suite trains under mpirun (test_train_mpi.py)
def test_train_across_two_namespace_hosts_equals_one_process(tmp_path):
    """`jaxhc train --transport xla`, data = 2, every message zfp8: two namespace hosts (one device
    each) give the losses, validation losses and wire bytes of one process with two devices."""
    policy = every_message("zfp8", tmp_path)
    args = [*TINY, *MESH, "--compression", policy, "--steps", "2", "--transport", "xla"]
    one, two = tmp_path / "one", tmp_path / "two"
    with open(tmp_path / "one.log", "w") as log:  # beside the cluster's run, on the other core
        single = subprocess.Popen(
            [*JAXHC, "--out", str(one), *args], cwd=ROOT, env=clean_env(), stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with Cluster(hosts=2) as cluster:
            done = cluster.run_distributed(
                [*JAXHC, "--out", str(two), *args], timeout=200, env=ONE, capture=True,
                check=False,
            )  # fmt: skip
        assert single.wait(timeout=200) == 0, (tmp_path / "one.log").read_text()[-3000:]
    finally:
        single.kill()
    assert [d.returncode for d in done] == [0, 0], "\n".join(d.stdout[-3000:] for d in done)
    same_run(one, two)
    assert len(records(two)) == 2 and records(two)[-1]["wire_bytes"]["data"] > 0


# CI time (~30 s): under `slow`; the quick suite kills a jax.distributed peer on loopback
# (tests/test_mpi_launch.py), the same heartbeat path without the namespace hosts.
@pytest.mark.slow
@needs_cluster
@pytest.mark.timeout(300)
def test_a_killed_host_ends_the_job_within_60_s_naming_it(tmp_path):
    """Host 1's process is SIGKILLed after the first step: host 0's process ends by itself (jax's
    coordination service misses host 1's heartbeats) and the error names host 1."""
    out = tmp_path / "run"
    args = [*TINY, *MESH, "--steps", "200", "--transport", "xla", "train.eval_every=1000"]
    killed = {}

    def kill_after_first_step(procs):
        def watch():
            metrics = out / "metrics.jsonl"
            deadline = time.monotonic() + 200
            while time.monotonic() < deadline and procs[1].poll() is None:
                if metrics.exists() and metrics.read_text().count("\n") >= 1:
                    procs[1].kill()
                    killed["at"] = time.monotonic()
                    return
                time.sleep(0.1)

        threading.Thread(target=watch, daemon=True).start()

    with Cluster(hosts=2) as cluster:
        with pytest.raises(ClusterError) as err:
            cluster.run_distributed(
                [*JAXHC, "--out", str(out), *args], timeout=250, env=ONE, capture=True,
                on_start=kill_after_first_step,
            )  # fmt: skip
        ended = time.monotonic()
    assert "at" in killed, str(err.value)
    msg = str(err.value)
    assert f"host 1 ({cluster.names[1]}, 10.77.0.2) was killed by SIGKILL first" in msg, msg
    # host 0 ended by itself (jax aborts it: SIGABRT), not by the harness after its grace
    by_itself = r"; host 0 (was killed by SIGABRT|exited with status \d+) [\d.]+ s later$"
    assert re.search(by_itself, msg), msg
    assert ended - killed["at"] < 60, msg
