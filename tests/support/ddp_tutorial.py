"""The DDP tutorial's script, as users write it, for trainctl's command jobs.

Launch conventions: torch.distributed.launch (--local_rank=N) or torchrun
(LOCAL_RANK). Trains a Linear(5 -> 2) on a small RandomDataset with
DistributedSampler + set_epoch, DDP, Adam and CrossEntropyLoss over Gloo,
then all_gathers the final parameters and fails unless every rank holds the
same ones. --mode picks a fault for the tests: raise, hang-once (rank 1
waits to be killed on the first attempt), hang (DataLoader workers, until
cancelled).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--mode", default="train")
parser.add_argument("--marker", default="")
args = parser.parse_args()
local_rank = args.local_rank if args.local_rank >= 0 else int(os.environ["LOCAL_RANK"])
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
print("local_rank=%d from %s TORCHELASTIC_RESTART_COUNT=%s OMP_NUM_THREADS=%s" %
      (local_rank, "arg" if args.local_rank >= 0 else "env", restart, os.environ.get("OMP_NUM_THREADS")),
      flush=True)
if args.mode == "raise" and os.environ["RANK"] == "1":
    raise ValueError("learning rate must be positive, got -1")

try:
    import trainctl
except ImportError:
    trainctl = None


class RandomDataset(Dataset):
    def __init__(self, size, length):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(length, size, generator=g)
        self.target = torch.randint(0, 2, (length,), generator=g)

    def __getitem__(self, index):
        return self.data[index], self.target[index]

    def __len__(self):
        return len(self.data)


dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == int(os.environ["WORLD_SIZE"])
torch.manual_seed(1234 + rank)  # different initial weights: DDP's broadcast makes them equal
model = DDP(nn.Linear(5, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
dataset = RandomDataset(5, 240)
sampler = DistributedSampler(dataset)
workers = 2 if args.mode == "hang" else 0
loader = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=workers)

if args.mode == "hang-once" and restart == "0" and rank == 1:
    open(args.marker, "w").write(str(os.getpid()))
    time.sleep(120)

step = 0
for epoch in range(args.epochs if args.mode != "hang" else 1000000):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if trainctl:
            trainctl.report(step=step, epoch=epoch, loss=loss.item())
        if args.mode == "hang":
            if args.marker and rank == 0:
                open(args.marker, "w").write(str(os.getpid()))
            time.sleep(0.2)

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
same = all(torch.equal(gathered[0], g) for g in gathered)
print("rank %d final parameters %s identical=%s" % (rank, [round(v, 6) for v in flat.tolist()], same),
      flush=True)
dist.destroy_process_group()
sys.exit(0 if same else 3)
