"""pytest under mpirun: a test that fails on one rank aborts the whole job, so that no
other rank waits forever in a collective; every rank shares one temporary directory."""
import os
import shutil
import tempfile

import pytest
from mpi4py import MPI


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and MPI.COMM_WORLD.size > 1:
        print(f"\nrank {MPI.COMM_WORLD.rank}: {item.nodeid} failed:\n{report.longreprtext}", flush=True)
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture
def shared_dir():
    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="distckpt-py-") if comm.rank == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def comm():
    import distckpt
    c = distckpt.Comm.from_mpi4py(MPI.COMM_WORLD)
    yield c
    c.close()
