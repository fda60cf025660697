#!/usr/bin/python3
"""A stand-in for trainctl-rank for the telemetry tests
(tests/telemetry_e2e_test.cc): speaks the daemon <-> rank protocol
(worker/protocol/rank_protocol.h) without LibTorch, and produces telemetry
whose content depends only on the job, so two runs can be compared. What it
does is chosen by words in the job name (config key `name`):

  chatty  training.epochs epochs of STEPS steps, ~0.05 s each; per step one
          train metric point, one progress report and one stdout line; per
          epoch an epoch_end point and an "epoch E done" line
  flood   prints 100 MB of log lines in a tight loop, then succeeds
"""
import os, socket, sys, time

STEPS = 20

def main():
    cfg = {}
    path = sys.argv[sys.argv.index("--config") + 1]
    for line in open(path):
        line = line.rstrip("\n")
        if line and "=" in line:
            k, v = line.split("=", 1)
            cfg[k] = v
    status = os.fdopen(int(cfg["run.status_fd"]), "w", buffering=1)
    def say(s):
        status.write(s + "\n")
        status.flush()
    name = cfg.get("name", "")
    rank = int(cfg["run.rank"])
    epochs = int(cfg.get("training.epochs", "1"))
    listener = None
    if rank == 0 and cfg.get("run.store_address", "") == "":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        say("rendezvous 127.0.0.1:%d" % listener.getsockname()[1])
    print("rank %d starting" % rank, flush=True)
    say("ready")
    if "flood" in name:
        block = "".join("flood line %07d %s\n" % (i, "x" * 80) for i in range(650)).encode()
        out = sys.stdout.buffer
        written = 0
        while written < 100 * 1000 * 1000:
            out.write(block)
            written += len(block)
        out.flush()
        print("flood done: %d bytes" % written, flush=True)
    for epoch in range(epochs):
        for step in range(1, STEPS + 1):
            time.sleep(0.05)
            g = epoch * STEPS + step
            say("metric kind=train epoch=%d step=%d steps_per_epoch=%d loss=%f lr=0.001 samples_per_sec=100 samples_seen=%d"
                % (epoch, step, STEPS, 1.0 / g, g * 10))
            say("progress %d %d" % (epoch, g))
            print("rank %d epoch %d step %d" % (rank, epoch, step), flush=True)
        say("metric kind=epoch_end epoch=%d step=%d steps_per_epoch=%d loss=%f eval_loss=0.5 eval_accuracy=0.75 eval_samples=10"
            % (epoch, STEPS, STEPS, 1.0 / ((epoch + 1) * STEPS)))
        print("epoch %d done" % epoch, flush=True)
    sys.exit(0)

main()
