"""distckpt.torch: save and load a PyTorch application state as it is, nested.

An example::

    import distckpt, distckpt.torch as dt
    comm = distckpt.Comm.world()
    mesh = dt.Mesh(comm, dp=2, tp=2)
    state = {"model": model, "optim": optimizer, "sched": scheduler, "step": 120,
             "rng": torch.get_rng_state()}
    placements = {"model.fc1.weight": dt.Shard(0, "tp"), "rng": dt.PerRank()}
    dt.save(comm, state, "/ckpt", step=120, mesh=mesh, placements=placements)   # /ckpt/step-120
    result = dt.load(comm, state, "/ckpt", mesh=mesh, placements=placements)    # the newest

The state is a tree. A node may be an object with `state_dict()`/`load_state_dict()` (a module,
an optimizer, a scheduler), a tensor, a dict, list or tuple of nodes, or a plain value (int,
float, bool, str, None, bytes, numpy scalars, torch.dtype, torch.device). It is walked again at
every save and every load, so a parameter given new storage between two saves (`p.data = ...`,
`module.double()`) is saved as it is now, never from its old memory.

Names follow the tree: `model.fc1.weight`. An optimizer's state is named by its parameter's
path, found through the modules of the same state (`optim.state.model.fc1.weight.exp_avg`), and
its `param_groups` keep their hyper-parameters with the parameters' paths, so a model built in
another order still gets each group's. Loading into a fresh optimizer whose state is still empty
(Adam before its first `step()`) first makes that state with one step at learning rate 0 and
zero gradients, as torch.distributed.checkpoint does.

Placements name where tensors live on a named Mesh: Shard(dim, axis) splits as torch.chunk
does, Replicate() (the default) is checked to be equal on every rank that holds it, PerRank()
keeps each rank's own tensor or plain value. Plain values are stored as typed JSON
(`encode_value`), never pickled: a tuple comes back a tuple, an int key an int key.

Tensors may be views (any strides: saved from and loaded into in place) and may live on a
device: CUDA tensors are staged through pinned host buffers by torch's own copies (a save
copies them out before it writes; a load copies back in place before it returns; see
staging_info). Meta tensors are refused.
"""
from ._io import STATE_KEY, LoadResult, load, save, stored_values
from ._manager import CheckpointManager
from ._mesh import Mesh, PerRank, Replicate, Shard
from ._staging import StagingInfo, release_staging, set_pinned_limit, staging_info
from ._values import ENCODING_VERSION, decode_value, encode_value

__all__ = ["save", "load", "stored_values", "LoadResult", "CheckpointManager", "Mesh", "Shard", "Replicate", "PerRank",
           "encode_value", "decode_value", "STATE_KEY", "ENCODING_VERSION", "StagingInfo", "staging_info",
           "set_pinned_limit", "release_staging"]
