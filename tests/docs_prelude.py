# What the guides' Python examples leave to the reader (tests/docs_examples.sh puts this
# before them): a small tensor-parallel model for dp=2 x tp=2 on 4 ranks, its optimizer and
# scheduler, a training step, a torch tensor and a module to load into.
import os

import torch

comm_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
tp_index = comm_rank % 2  # rank = dp_index * 2 + tp_index


class TwoLayers(torch.nn.Module):  # fc1 split by rows over tp, fc2 by columns
    def __init__(self):
        super().__init__()
        torch.manual_seed(100 + tp_index)  # the same shards on both dp replicas
        self.fc1 = torch.nn.Linear(8, 16 // 2)
        self.fc2 = torch.nn.Linear(16 // 2, 4)
        torch.manual_seed(7)
        self.fc2.bias.data = torch.randn(4)  # replicated: equal on every rank


model = TwoLayers()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
steps = 4


def train_step():  # the same update on every replica
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.99)
    optimizer.step()
    scheduler.step()
    return 0.5


torch_tensor = torch.arange(6, dtype=torch.float64)  # replicated


class Holder(torch.nn.Module):  # parameters named as the example's stored tensors
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4 * world, 8))
        self.b = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))


module = Holder()
