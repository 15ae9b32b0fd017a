"""Test session setup: 8 simulated host devices (set before jax is imported anywhere)."""

import os

import pytest

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

# Modules whose tests start jobs of several processes (mpirun, jax.distributed, network-namespace
# hosts). `make test` runs the suite on two pytest-xdist workers (`--dist loadgroup`); these run one
# after another on one of them: two such jobs at once on a 2-core machine would starve each other
# past their time limits, and the namespace hosts have fixed names.
MULTI_PROCESS = {
    "test_distributed",
    "test_faults",
    "test_links",
    "test_links_xla",
    "test_mpi_launch",
    "test_train_mpi",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's hook reads the group into the test's id
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in MULTI_PROCESS:
            item.add_marker(pytest.mark.xdist_group("multi_process"))
