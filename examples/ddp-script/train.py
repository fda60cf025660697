"""The PyTorch DDP tutorial's training script, unchanged by trainctl.

Runs under torchrun, torch.distributed.launch, `trainctl run` or a trainctl
command job (job.yaml beside it):

    torchrun --nproc_per_node=2 train.py
    python -m torch.distributed.launch --nproc_per_node=2 train.py
    trainctl run --nproc-per-node 2 train.py --epochs 2
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

try:  # progress for `trainctl status` / `--follow`; a no-op elsewhere
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    device = torch.device("cuda", args.local_rank) if cuda else torch.device("cpu")

    model = nn.Linear(5, 2).to(device)
    model = DDP(model, device_ids=[args.local_rank] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    dataset = RandomDataset(5, 600)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if trainctl:
                trainctl.report(step=step, epoch=epoch, loss=loss.item())
        if dist.get_rank() == 0:
            print("epoch %d: loss %.4f" % (epoch, loss.item()), flush=True)

    if dist.get_rank() == 0:
        out = (trainctl.checkpoint_dir() if trainctl else None) or "."
        os.makedirs(out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(out, "model.pt"))
        print("saved", os.path.join(out, "model.pt"), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
