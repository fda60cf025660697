#!/usr/bin/python3
"""Round-trip floor of a Gloo all-reduce on this machine, from Python.

   /usr/bin/python3 bench/ddp/gloo_latency.py [--floats 12] [--iters 3000]

Starts 2 ranks on loopback (env://), all-reduces a tensor of --floats
float32 --iters times and prints the median and p90 latency per call (rank 0).
Config 1 (Linear 5→2) all-reduces 12 floats per step, so this is the floor
of its exposed communication on either side.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--floats", type=int, default=12)
    ap.add_argument("--iters", type=int, default=3000)
    args = ap.parse_args()
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(2):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                       LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__] + sys.argv[1:], env=env,
                                          stdout=subprocess.PIPE, text=True))
        try:
            outs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        print(outs[0].strip())
        return 0
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    t = torch.zeros(args.floats)
    lat = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        lat.append(time.perf_counter() - t0)
    dist.barrier()
    lat = sorted(lat[args.iters // 10:])
    if int(os.environ["RANK"]) == 0:
        print(json.dumps({"floats": args.floats, "iters": args.iters,
                          "median_ms": round(1e3 * lat[len(lat) // 2], 3),
                          "p90_ms": round(1e3 * lat[int(len(lat) * 0.9)], 3)}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
