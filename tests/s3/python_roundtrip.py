"""distckpt.torch.save/load with an s3:// root (run under mpirun by object_root.sh): a
model and its optimizer saved into the object root, loaded into fresh ones, compared."""
import sys

import torch
from mpi4py import MPI

import distckpt
import distckpt.torch as dt

root = sys.argv[1]
comm = distckpt.Comm.from_mpi4py(MPI.COMM_WORLD)
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
optim = torch.optim.AdamW(model.parameters())
torch.manual_seed(1)
model(torch.randn(2, 8)).sum().backward()
optim.step()
dt.save(comm, {"model": model, "optim": optim, "step": 3}, root, step=3)
fresh, fresh_optim = torch.nn.Linear(8, 4), None
fresh_optim = torch.optim.AdamW(fresh.parameters())
state = {"model": fresh, "optim": fresh_optim, "step": 0}
dt.load(comm, state, root)
assert torch.equal(fresh.weight, model.weight) and state["step"] == 3
assert torch.equal(fresh_optim.state_dict()["state"][0]["exp_avg"], optim.state_dict()["state"][0]["exp_avg"])
listed = distckpt.list_checkpoints(root)
assert [e.name for e in listed] == ["step-3"] and listed[0].latest, listed
if MPI.COMM_WORLD.rank == 0:
    print("python s3 round trip: ok")
