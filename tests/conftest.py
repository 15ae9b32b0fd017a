"""Test session setup: 8 simulated host devices (set before jax is imported anywhere)."""

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()


# `make test` runs the modules on two pytest-xdist workers (--dist loadscope
# --no-loadscope-reorder: a module on one worker, in collection order, each worker two modules
# ahead). The longest modules (shared training runs, multi-process jobs: minutes each) go first,
# so the short ones fill in at the end instead of one worker running a long module alone while
# the other idles; multi-process modules alternate with in-process ones, so that two of them
# rarely run at once.
LONGEST_FIRST = (
    "test_train_mpi.py",
    "test_model_parallel.py",
    "test_distributed.py",
    "test_train.py",
    "test_mpi_launch.py",
    "test_amsp.py",
    "test_faults.py",
    "test_zfp_kernels.py",
    "test_overlap.py",
    "test_links_xla.py",
    "test_checkpoint.py",
    "test_model_hf.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as found
