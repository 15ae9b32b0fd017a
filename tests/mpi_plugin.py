"""pytest plugin for suites run under mpirun (`-p mpi_plugin`, with tests/ on PYTHONPATH).

Rank 0 reports as usual; the other ranks stay quiet. A test that fails on any rank ends the whole
job at once (MPI_Abort after printing the failure), since the other ranks would otherwise wait
forever in their next collective.
"""

import sys

import pytest


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if _world().Get_rank() != 0:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report):
    comm = _world()
    if report.failed and comm.Get_size() > 1:
        rank = comm.Get_rank()
        sys.stdout.flush()
        sys.stderr.write(
            f"\n[rank {rank}] {report.nodeid} failed ({report.when}); aborting the MPI job:\n"
            f"{report.longreprtext}\n"
        )
        sys.stderr.flush()
        comm.Abort(1)
