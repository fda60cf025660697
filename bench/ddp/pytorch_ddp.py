#!/usr/bin/python3
"""PyTorch DDP baseline for bench/ddp, written the way the PyTorch docs teach.

DistributedSampler + set_epoch, DataLoader(num_workers=0), DistributedDataParallel,
Gloo on loopback, torch.set_num_threads(1), Adam, cross-entropy. The same
model, data, per-rank batch, optimizer and seed as the trainctl job that
bench/ddp/run.sh runs next to it.

Run without RANK in the environment and it is the launcher: it starts
--nproc rank processes itself with the torchrun env contract (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK; Debian's torchrun 1.13 crashes on
Python 3.11), waits for them and prints one JSON object with every rank's
result. Needs /usr/bin/python3 (Debian's torch 1.13).

Timing is the same as trainctl's metric windows: every --window optimizer
steps a rank records samples/(wall time since the window started), the
window covering data loading, forward, backward (with the all-reduce wait)
and the optimizer step. The first --warmup-windows windows are left out;
the steady-state rate is the samples of the remaining windows over their
time.
"""

import argparse
import gzip
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["linear", "mlp", "cnn"], required=True,
                   help="linear: Linear(5->2); mlp: --input-dim -> --hidden ... -> --classes; cnn: trainctl's cnn")
    p.add_argument("--input-dim", type=int, default=5)
    p.add_argument("--hidden", type=str, default="", help="comma-separated hidden sizes (mlp)")
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--batch-norm", action="store_true", help="cnn: BatchNorm2d after each conv")
    p.add_argument("--data", choices=["synthetic", "idx"], default="synthetic")
    p.add_argument("--length", type=int, default=3000, help="synthetic: samples")
    p.add_argument("--data-seed", type=int, default=0, help="synthetic: generator seed")
    p.add_argument("--images", default="", help="idx: images file (.gz or raw)")
    p.add_argument("--labels", default="", help="idx: labels file (.gz or raw)")
    p.add_argument("--eval-images", default="", help="idx: evaluation images (after every epoch)")
    p.add_argument("--eval-labels", default="", help="idx: evaluation labels")
    p.add_argument("--batch", type=int, default=30, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="model init seed and DistributedSampler seed")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--comm-hook", choices=["none", "fp16_compress", "bf16_compress", "powersgd"], default="none",
                   help="DDP communication hook (torch.distributed.algorithms.ddp_comm_hooks)")
    p.add_argument("--powersgd-rank", type=int, default=1, help="powersgd: matrix_approximation_rank")
    p.add_argument("--powersgd-start-iter", type=int, default=1000, help="powersgd: start_powerSGD_iter")
    p.add_argument("--window", type=int, default=20, help="steps per timing window")
    p.add_argument("--warmup-windows", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nproc", type=int, default=2, help="launcher: ranks to start")
    p.add_argument("--timeout", type=float, default=600, help="launcher: seconds before the ranks are killed")
    return p.parse_args(argv)


# ----------------------------------------------------------------- launcher

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    launch_unix = time.time()
    port = free_port()
    procs = []
    outs = []

    def kill_all(*_):
        for p in procs:
            if p.poll() is None:
                p.kill()

    def on_signal(signum, _frame):
        kill_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for r in range(args.nproc):
            env = dict(os.environ)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.nproc),
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS=str(args.threads))
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + args.timeout
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_all()
                out, err = p.communicate()
                err += "\n[launcher] timed out after %.0f s" % args.timeout
            outs.append((p.returncode, out, err))
    finally:
        kill_all()
    ranks = []
    ok = True
    for r, (rc, out, err) in enumerate(outs):
        res = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
        if rc != 0 or res is None:
            ok = False
            sys.stderr.write("rank %d failed (rc %s):\n%s\n" % (r, rc, err[-3000:]))
        else:
            ranks.append(res)
    summary = {"ok": ok, "world_size": args.nproc, "ranks": ranks, "launch_unix": launch_unix}
    if ok:
        summary["samples_per_sec_sum"] = sum(r["samples_per_sec"] for r in ranks)
        summary["step_ms_mean"] = sum(r["step_ms"] for r in ranks) / len(ranks)
    print(json.dumps(summary))
    return 0 if ok else 1


# ----------------------------------------------------------------- rank

def read_idx(path):
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def build_model(args, torch):
    nn = torch.nn
    if args.model == "linear":
        return nn.Linear(args.input_dim, args.classes)
    if args.model == "mlp":
        layers, d = [], args.input_dim
        for h in [int(x) for x in args.hidden.split(",") if x]:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, args.classes))
        return nn.Sequential(*layers)

    class Cnn(nn.Module):  # trainctl's built-in `cnn` (worker/engine/model.cc)
        def __init__(self, classes, batch_norm, c1=32, c2=64, hidden=128, image=28):
            super().__init__()
            self.batch_norm = batch_norm
            self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
            self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
            if batch_norm:
                self.bn1 = nn.BatchNorm2d(c1)
                self.bn2 = nn.BatchNorm2d(c2)
            side = image // 4
            self.fc1 = nn.Linear(c2 * side * side, hidden)
            self.fc2 = nn.Linear(hidden, classes)

        def forward(self, x):
            x = self.conv1(x)
            if self.batch_norm:
                x = self.bn1(x)
            x = torch.max_pool2d(torch.relu(x), 2)
            x = self.conv2(x)
            if self.batch_norm:
                x = self.bn2(x)
            x = torch.max_pool2d(torch.relu(x), 2)
            x = torch.relu(self.fc1(x.flatten(1)))
            return self.fc2(x)

    return Cnn(args.classes, args.batch_norm)


def rank_main(args):
    import datetime
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))

    # Data: the same tensors trainctl builds.
    if args.data == "synthetic":
        g = torch.Generator().manual_seed(args.data_seed)
        inputs = torch.randn(args.length, args.input_dim, generator=g)
        targets = torch.randint(0, args.classes, (args.length,), generator=g, dtype=torch.long)
    else:
        import numpy as np
        images = read_idx(args.images)
        labels = read_idx(args.labels)
        inputs = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
        targets = torch.from_numpy(labels.astype(np.int64))
    dataset = TensorDataset(inputs, targets)
    eval_loader = None
    if args.eval_images:
        import numpy as np
        ev_x = torch.from_numpy(read_idx(args.eval_images).astype(np.float32) / 255.0).unsqueeze(1)
        ev_y = torch.from_numpy(read_idx(args.eval_labels).astype(np.int64))
        ev_set = TensorDataset(ev_x, ev_y)
        # Each rank evaluates its shard; the sums are all-reduced (no padding: drop_last=False pads,
        # so shard by hand to count every sample exactly once).
        ev_idx = list(range(rank, len(ev_set), world))
        eval_loader = DataLoader(torch.utils.data.Subset(ev_set, ev_idx), batch_size=256)
    evals = []

    torch.manual_seed(args.seed)
    model = build_model(args, torch)
    ddp_model = DDP(model, bucket_cap_mb=args.bucket_mb)
    if args.comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        if args.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=args.powersgd_rank,
                start_powerSGD_iter=args.powersgd_start_iter, min_compression_rate=2, use_error_feedback=True,
                warm_start=True, random_seed=0)
            ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        else:
            ddp_model.register_comm_hook(None, getattr(default_hooks, args.comm_hook + "_hook"))
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=0)

    windows = []  # [samples, seconds, data_s, fwd_s, bwd_s, opt_s, steps]
    window_losses = []  # [optimizer steps since the start, mean training loss of the window] (this rank)
    global_step = 0
    first_loss = last_loss = None
    first_step_unix = None
    w_loss = torch.zeros((), dtype=torch.float64)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        w_samples = w_steps = 0
        w_data = w_fwd = w_bwd = w_opt = 0.0
        w_loss.zero_()  # the last epoch's partial window is dropped, its loss too
        w_start = time.perf_counter()
        it = iter(loader)
        step = 0
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            optimizer.zero_grad()
            out = ddp_model(x)
            loss = loss_fn(out, y)
            t2 = time.perf_counter()
            loss.backward()  # includes waiting for the last bucket's all-reduce
            t3 = time.perf_counter()
            optimizer.step()
            t4 = time.perf_counter()
            if first_step_unix is None:
                first_step_unix = time.time()
            w_loss += loss.detach().double()
            step += 1
            global_step += 1
            w_steps += 1
            w_samples += x.size(0)
            w_data += t1 - t0
            w_fwd += t2 - t1
            w_bwd += t3 - t2
            w_opt += t4 - t3
            if step % args.window == 0:
                now = time.perf_counter()
                windows.append([w_samples, now - w_start, w_data, w_fwd, w_bwd, w_opt, w_steps])
                window_losses.append([global_step, w_loss.item() / w_steps])
                w_loss.zero_()
                if first_loss is None:
                    first_loss = loss.item()
                last_loss = loss.item()
                w_samples = w_steps = 0
                w_data = w_fwd = w_bwd = w_opt = 0.0
                w_start = time.perf_counter()
        # a partial last window is dropped (trainctl reports it; run.sh drops it there too)
        if eval_loader is not None:
            ddp_model.eval()
            sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
            with torch.no_grad():
                for x, y in eval_loader:
                    out = ddp_model.module(x)
                    sums[0] += torch.nn.functional.cross_entropy(out, y, reduction="sum").double()
                    sums[1] += (out.argmax(1) == y).sum().double()
                    sums[2] += y.numel()
            dist.all_reduce(sums)
            evals.append({"epoch": epoch, "loss": (sums[0] / sums[2]).item(),
                          "accuracy": (sums[1] / sums[2]).item(), "samples": int(sums[2].item())})

    dist.barrier()
    dist.destroy_process_group()
    steady = windows[args.warmup_windows:]
    if not steady:
        raise SystemExit("no steady-state window: raise --length/--epochs or lower --warmup-windows")
    samples = sum(w[0] for w in steady)
    secs = sum(w[1] for w in steady)
    steps = sum(w[6] for w in steady)
    res = {
        "rank": rank,
        "windows": len(windows),
        "steady_windows": len(steady),
        "samples_per_sec": samples / secs,
        "window_samples_per_sec": [round(w[0] / w[1], 1) for w in windows],
        "step_ms": 1e3 * secs / steps,
        "data_ms": 1e3 * sum(w[2] for w in steady) / steps,
        "forward_ms": 1e3 * sum(w[3] for w in steady) / steps,
        "backward_ms": 1e3 * sum(w[4] for w in steady) / steps,
        "optimizer_ms": 1e3 * sum(w[5] for w in steady) / steps,
        "params": sum(p.numel() for p in model.parameters()),
        "first_loss": first_loss,
        "last_loss": last_loss,
        "window_losses": window_losses,
        "evals": evals,
        "first_step_unix": first_step_unix,
    }
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if "RANK" not in os.environ:
        return launch(args, argv)
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
