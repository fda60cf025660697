#!/usr/bin/python3
"""A stand-in for trainctl-rank that speaks the daemon <-> rank protocol
(worker/protocol/rank_protocol.h) without LibTorch, so the worker daemon
can be tested fast and under sanitizers. What it does is chosen by words
in the job name (config key `name`):

  ok (default)  trains training.epochs epochs of ~0.2 s, reports metrics, exits 0
  crash         rank 1 of attempt 1 kills itself with SIGSEGV after epoch 0
  config        rank 0 reports `error config ...` and exits 2
  hang          runs until stopped (ignores nothing: SIGTERM ends it)
  stubborn      like hang but ignores SIGTERM (the daemon must SIGKILL)
  spam          prints log lines in a tight loop for a second, then succeeds
  slow          epochs of ~1 s
  chatty        epochs of CHATTY_STEPS steps of ~0.05 s, each with a train
                point, a progress report and a log line whose content depends
                only on the job (tests/telemetry_e2e_test.cc compares runs)
  flood         prints 100 MB of log lines in a tight loop, then runs chatty
                epochs (a second of lines, so the rate limit's "dropped"
                note comes before the last line)

A job named "...model..." ends with rank 0 exporting a 2.5 MiB final model
<job id>.model.pt (deterministic bytes after the job id, several fetch
pieces) and reporting it with a `model` line, as trainctl-rank does.

The checkpoint writer (run.checkpoint_writer) keeps the epoch count in a file
named for the job in run.checkpoint_dir and reports it with a `checkpoint`
line; an attempt given run.resume_from starts from the epoch in that file.
"""
import os, signal, socket, sys, time, zlib

CHATTY_STEPS = 20

def write_checkpoint(say, ckpt, job, epochs, step):
    """The epoch count, written atomically and reported as trainctl-rank does."""
    os.makedirs(ckpt, exist_ok=True)
    path = os.path.join(ckpt, "%s.ckpt-epoch-%06d.pt" % (job, epochs))
    data = str(epochs).encode()
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)
    say("checkpoint %d %d %d crc32:%08x %s" % (epochs, step, len(data), zlib.crc32(data), path))

def chatty_epoch(say, rank, epoch):
    for step in range(1, CHATTY_STEPS + 1):
        time.sleep(0.05)
        g = epoch * CHATTY_STEPS + step
        say("metric kind=train epoch=%d step=%d steps_per_epoch=%d loss=%f lr=0.001 samples_per_sec=100 samples_seen=%d"
            % (epoch, step, CHATTY_STEPS, 1.0 / g, g * 10))
        say("progress %d %d" % (epoch, g))
        print("rank %d epoch %d step %d" % (rank, epoch, step), flush=True)
    say("metric kind=epoch_end epoch=%d step=%d steps_per_epoch=%d loss=%f eval_loss=0.5 eval_accuracy=0.75 eval_samples=10"
        % (epoch, CHATTY_STEPS, CHATTY_STEPS, 1.0 / ((epoch + 1) * CHATTY_STEPS)))
    print("epoch %d done" % epoch, flush=True)

def main():
    cfg = {}
    if "--config-fd" in sys.argv:  # the daemon's way: rank.conf opened for us
        source = os.fdopen(int(sys.argv[sys.argv.index("--config-fd") + 1]))
    else:
        source = open(sys.argv[sys.argv.index("--config") + 1])
    for line in source:
        line = line.rstrip("\n")
        if line and "=" in line:
            k, v = line.split("=", 1)
            cfg[k] = v
    fd = int(cfg["run.status_fd"])
    status = os.fdopen(fd, "w", buffering=1)
    def say(s):
        status.write(s + "\n")
        status.flush()
    name = cfg.get("name", "")
    rank = int(cfg["run.rank"])
    attempt = int(cfg["run.attempt"])
    epochs = int(cfg.get("training.epochs", "1"))
    ckpt = cfg["run.checkpoint_dir"]
    assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == cfg["run.world_size"]
    if "stubborn" in name:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = None
    if rank == 0 and cfg.get("run.store_address", "") == "":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        say("rendezvous 127.0.0.1:%d" % listener.getsockname()[1])
    print("rank %d of %s attempt %d starting" % (rank, cfg["run.world_size"], attempt), flush=True)
    if "config" in name and rank == 0:
        print("bad data file", file=sys.stderr, flush=True)
        say("error config data.train.images: /nope/images.gz: no such file")
        sys.exit(2)
    say("ready")
    if "hang" in name or "stubborn" in name:
        while True:
            time.sleep(0.1)
    if "flood" in name:
        block = "".join("flood line %07d %s\n" % (i, "x" * 80) for i in range(650)).encode()
        written = 0
        while written < 100 * 1000 * 1000:
            sys.stdout.buffer.write(block)
            written += len(block)
        sys.stdout.buffer.flush()
        print("flood done: %d bytes" % written, flush=True)
    start = 0
    if cfg.get("run.resume_from"):
        start = int(open(cfg["run.resume_from"]).read())
        print("resumed from epoch %d" % start, flush=True)
    epoch_time = 1.0 if "slow" in name else 0.2
    for epoch in range(start, epochs):
        if "chatty" in name or "flood" in name:
            chatty_epoch(say, rank, epoch)
            continue
        if "spam" in name:
            end = time.time() + 1.0
            i = 0
            while time.time() < end:
                print("spam line %d" % i)
                i += 1
            sys.stdout.flush()
        for step in range(1, 5):
            time.sleep(epoch_time / 4)
            say("progress %d %d" % (epoch, epoch * 4 + step))
        say("metric kind=train epoch=%d step=4 steps_per_epoch=4 loss=%f lr=0.001 samples_per_sec=100 samples_seen=%d"
            % (epoch, 1.0 / (epoch + 1), (epoch + 1) * 120))
        say("metric kind=epoch_end epoch=%d step=4 steps_per_epoch=4 loss=%f eval_loss=0.5 eval_accuracy=0.8 eval_samples=10"
            % (epoch, 1.0 / (epoch + 1)))
        print("epoch %d done" % epoch, flush=True)
        if cfg.get("run.checkpoint_writer") == "true":
            write_checkpoint(say, ckpt, cfg["run.job_id"], epoch + 1, (epoch + 1) * 4)
        if "crash" in name and rank == 1 and attempt == 1 and epoch == 0:
            print("about to crash", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
    if "model" in name and rank == 0:
        os.makedirs(ckpt, exist_ok=True)
        path = os.path.join(ckpt, "%s.model.pt" % cfg["run.job_id"])
        # Deterministic bytes that start with the job id (two jobs' models differ).
        job = cfg["run.job_id"].encode()
        with open(path + ".tmp", "wb") as f:
            f.write(job + bytes((i * 7 + i // 251) % 256 for i in range(len(job), 5 * 512 * 1024)))
        os.rename(path + ".tmp", path)
        say("model %s" % path)
    sys.exit(0)

main()
