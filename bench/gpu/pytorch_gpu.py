"""PyTorch on the same GPU, the same model, data and batch as the trainctl
run (world size 1, DDP over NCCL), with optional autocast: the baseline for
bench/gpu/run.sh. Prints `samples_per_sec=` lines per window of 50 steps."""
import argparse, os, time
import torch, torch.distributed as dist
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--job", required=True)
ap.add_argument("--amp", default="-")
ap.add_argument("--set", action="append", default=[])
a = ap.parse_args()
sets = dict(s.split("=", 1) for s in a.set)
cnn = "fashion-mnist" in a.job
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29611")
dist.init_process_group("nccl", rank=0, world_size=1)
dev = torch.device("cuda", 0)
torch.manual_seed(0)
if cnn:
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    x_all = torch.rand(60000, 1, 28, 28)
    y_all = torch.randint(0, 10, (60000,))
    batch = 64
else:
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    x_all = torch.randn(200000, 256)
    y_all = torch.randint(0, 10, (200000,))
    batch = int(sets.get("data.batch_size", 64))
model = nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[0])
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.cuda.amp.GradScaler(enabled=a.amp == "fp16")
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.amp)
loss_fn = nn.CrossEntropyLoss()
n = x_all.shape[0] // batch
t0, seen = time.time(), 0
for i in range(n):
    x = x_all[i * batch:(i + 1) * batch].to(dev, non_blocking=True)
    y = y_all[i * batch:(i + 1) * batch].to(dev, non_blocking=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    seen += batch
    if (i + 1) % 50 == 0:
        torch.cuda.synchronize()
        print("samples_per_sec=%.1f" % (seen / (time.time() - t0)), flush=True)
        t0, seen = time.time(), 0
dist.destroy_process_group()
