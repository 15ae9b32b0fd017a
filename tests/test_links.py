"""bench/links: the shaped-link cluster (network namespaces on a bridge, tc tbf, MPI across them).

Rates and the non-root refusal run anywhere; the rest needs root and network namespaces and is
skipped with the reason otherwise. The smoke test runs a 1 MiB psum (plain and zfp:8) across two
namespace hosts and compares it bit for bit with the same psum on two simulated devices in this
process; the others check that an interrupted run leaves no namespace behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import links_job
import mpi_helpers as h
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxhc
from bench.links import (
    PREFIX,
    Cluster,
    ClusterError,
    check_available,
    namespaces,
    parse_rate,
    remove_leftovers,
)

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "bench.links"]


def _why_not() -> str | None:
    try:
        check_available()
    except ClusterError as e:
        return f"no shaped-link cluster here: {e}"
    return h.mpi_ready()


NOT_HERE = _why_not()
needs_cluster = pytest.mark.skipif(NOT_HERE is not None, reason=str(NOT_HERE))


def test_rates_parse_as_tc_writes_them():
    assert parse_rate("100mbit") == 100e6
    assert parse_rate("1gbit") == parse_rate("1GBIT") == 1e9
    assert parse_rate("2.5gbit") == 2.5e9
    assert parse_rate("unshaped") is None and parse_rate(None) is None
    for bad in ("fast", "1gb", "0mbit", "-1gbit", "1 gbit"):
        with pytest.raises(ValueError, match=f"bad link rate '{bad}'"):
            parse_rate(bad)


def test_without_root_it_says_so_in_one_line():
    uid, prefix = os.geteuid(), []
    if uid == 0:  # run it as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to run the tool as another user")
        uid, prefix = 65534, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        module = ROOT / "bench" / "links" / "__main__.py"
        if subprocess.run([*prefix, "test", "-r", str(module)]).returncode != 0:
            # e.g. a clone under `mktemp -d` (mode 0700): the other user cannot load the tool
            pytest.skip(f"uid {uid} cannot read {module}")
    for cmd in (["run", "--", "true"], ["bench", "--quick"], ["clean"]):
        proc = subprocess.run([*prefix, *CLI, *cmd], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 1, proc
        assert proc.stderr.splitlines() == [
            f"bench-links: needs root to create network namespaces (running as uid {uid})"
        ], proc.stderr


def test_bad_options_are_one_line():
    for argv, msg in [
        (["run", "--rate", "fast", "--", "true"], "bad link rate 'fast'"),
        (["run"], "run: no command given"),
        (["bench", "--hosts", "1"], "--hosts '1': expected a whole number >= 2"),
        (["train", "--overlap", "yes"], "--overlap 'yes': expected on, off or on,off"),
    ]:
        proc = subprocess.run([*CLI, *argv], cwd=ROOT, capture_output=True, text=True)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc
        assert lines[0].startswith(f"bench-links: {msg}"), proc


@needs_cluster
@pytest.mark.timeout(120)
def test_smoke_psum_across_two_hosts_equals_one_process(tmp_path):
    out = tmp_path / "psum.npz"
    with Cluster(hosts=2, rate="1gbit") as cluster:
        assert "tbf" in cluster.qdisc(0) and "rate 1Gbit" in cluster.qdisc(1)
        env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        job = [sys.executable, str(ROOT / "tests" / "links_job.py"), str(out)]
        cluster.run(["timeout", "-k", "5", "90", *job], timeout=100, env=env, capture=True)
        made = [cluster.bridge, *cluster.names]
    assert not set(made) & set(namespaces())
    got = np.load(out)

    launcher = jaxhc.Launcher({"x": 2}, "xla")
    x = launcher.put(links_job.data(), P("x"))
    for key, step in links_job.steps(launcher).items():
        want = launcher.fetch(step(x), P())
        assert got[key].dtype == want.dtype and got[key].shape == want.shape
        assert got[key].tobytes() == want.tobytes(), f"codec {key}: MPI across links != XLA"
    assert np.array_equal(got["None"][0], links_job.data().sum(0))


@needs_cluster
def test_rate_of_a_live_cluster_changes():
    with Cluster(hosts=2) as cluster:
        assert "tbf" not in cluster.qdisc(0) and cluster.rate_bits is None
        cluster.set_rate("100mbit")
        assert all("tbf" in cluster.qdisc(i) and "rate 100Mbit" in cluster.qdisc(i) for i in (0, 1))
        cluster.set_rate("unshaped")
        assert "tbf" not in cluster.qdisc(1) and cluster.rate == "unshaped"


def _start_run(seconds: int) -> tuple[subprocess.Popen, list[str]]:
    """A CLI run holding a 2-host cluster, once its namespaces exist; with their names."""
    proc = subprocess.Popen(
        [*CLI, "run", "--hosts", "2", "--", "sleep", str(seconds)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    mine = f"{PREFIX}{proc.pid}-"
    deadline = time.monotonic() + 30
    while len(made := [n for n in namespaces() if n.startswith(mine)]) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc, made


@needs_cluster
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_no_namespace(sig):
    proc, made = _start_run(60)
    time.sleep(0.5)  # mpirun is starting or started inside host 0
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert err.splitlines()[-1] == (
        f"bench-links: interrupted by {sig.name}; its namespaces are deleted"
    )
    assert not set(made) & set(namespaces())


@needs_cluster
def test_a_killed_runs_namespaces_are_removed_by_the_next():
    proc, made = _start_run(60)
    proc.kill()
    proc.wait(timeout=30)
    assert set(made) <= set(namespaces())  # SIGKILL cannot be caught
    assert set(made) <= set(remove_leftovers())
    assert not set(made) & set(namespaces())
