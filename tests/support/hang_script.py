"""A two-rank torch.distributed (Gloo) script whose rank 1 stops mid-training.

Each step all-reduces a tensor and reports the step with trainctl.report. At
step --stop-at, rank 1 writes the wall time to --marker and sleeps forever
in wedged(): rank 0 then waits in the next all_reduce. Used by
tests/script_hang_e2e_test.cc: nothing in it configures hang detection.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import trainctl


def wedged(marker):
    with open(marker + ".tmp", "w") as f:
        f.write("%.3f\n" % time.time())
    os.rename(marker + ".tmp", marker)
    time.sleep(1e6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stop-at", type=int, default=30)
    ap.add_argument("--marker", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(1, 100000):
        dist.all_reduce(t)
        time.sleep(0.1)
        trainctl.report(step=step, epoch=0, loss=1.0 / step)
        if step % 10 == 0:
            print("rank %d step %d" % (rank, step), flush=True)
        if rank == 1 and step == args.stop_at:
            wedged(args.marker)


if __name__ == "__main__":
    main()
