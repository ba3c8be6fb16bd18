"""Comm.from_torch: jobs that torch.multiprocessing starts with the gloo backend and no MPI
(torch_comm_worker.py, at 4 and 2 processes), and the refusals that need no job.

The jobs run once, in the single-rank pytest run (python.np1): each starts its own
processes, and their environment is stripped of what mpirun sets, so that nothing in
them believes it runs under MPI."""
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup.sh installs it)")

import distckpt  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_comm_worker.py")
MPI_SIZE = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE"))

once = pytest.mark.skipif(
    MPI_SIZE not in (None, "1"),
    reason="starts its own torch.multiprocessing job: run once, in the single-rank run (python.np1), "
           f"not in each of these {MPI_SIZE} MPI ranks")


def without_launchers():
    """This environment less what mpirun, srun and torchrun set."""
    torchrun = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_")) and k not in torchrun}


def run_job(nprocs, root, *extra, timeout_s=150):
    """The worker's job at `nprocs` processes: (exit status, output). A job still running after
    timeout_s is killed with its processes (a new session: they go with it)."""
    p = subprocess.Popen([sys.executable, WORKER, str(nprocs), str(root), *extra], env=without_launchers(), cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"the {nprocs}-process job did not end in {timeout_s} s:\n{out}")
    return p.returncode, out


@once
def test_torch_multiprocessing_jobs_save_load_manage_and_reshard_without_mpi(tmp_path):
    # 4 processes: every path, and checkpoints saved for the 2-process job to load.
    rc, out = run_job(4, tmp_path)
    print(out)
    assert rc == 0, out
    assert "time job" in out, out
    rc, out = run_job(2, tmp_path)
    print(out)
    assert rc == 0, out
    assert "time reshard_load" in out, out


@once
@pytest.mark.parametrize("how", ["gone", "hung"])
def test_a_transport_failure_ends_the_process_naming_its_rank(tmp_path, how):
    # A peer that left, or one that hangs past the peer timeout (DISTCKPT_PEER_TIMEOUT_S=2).
    rc, out = run_job(2, tmp_path, how)
    print(out)
    assert rc != 0, out
    assert "distckpt: rank 0: torch.distributed failed in barrier" in out and "SIGABRT" in out, out


def test_from_torch_refuses_a_wrong_group_and_an_uninitialised_torch():
    import torch.distributed as dist
    if dist.is_initialized():  # pragma: no cover - nothing here initialises it
        pytest.skip("torch.distributed is initialised in this process")
    with pytest.raises(TypeError, match="group must be a torch.distributed process group"):
        distckpt.Comm.from_torch("world")
    with pytest.raises(distckpt.DistckptError, match="init_process_group"):
        distckpt.Comm.from_torch()
