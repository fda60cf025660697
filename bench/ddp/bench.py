#!/usr/bin/python3
"""bench/ddp driver: trainctl vs Python PyTorch DDP on the same jobs.

Started by bench/ddp/run.sh (see there). For every configuration it runs
`trainctl -o json run JOB.yaml` and `pytorch_ddp.py` alternately, --runs
times each, and takes the median. Both sides are timed the same way:
windows of W optimizer steps per rank (trainctl: its `metrics.every_steps`
metric points; Python: the same window in pytorch_ddp.py), the first
--warmup-windows windows dropped, and a partial last window dropped;
steady-state samples/s per rank = samples / seconds over the remaining
windows, summed over the ranks.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY = "/usr/bin/python3"  # Debian's torch 1.13; the python3 first on PATH has no torch
FMNIST = "/usr/share/datasets/fashion-mnist"
SECTION = "## DDP: trainctl vs PyTorch"
HOOKS_SECTION = "## DDP communication hooks"
BUILDS_SECTION = "## DDP: this build against an older one"

CHILDREN = set()
# glibc malloc: fixed (hence non-dynamic) trim and mmap thresholds, so freed
# memory stays in the heap instead of being returned and faulted in again.
# trainctl-rank sets the same thresholds itself (rank_main.cc); the Python
# side gets them through the environment in every headline row, so both
# sides' allocators are treated alike.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": "1073741824", "MALLOC_MMAP_THRESHOLD_": "1073741824"}
# trainctl without its shared-memory all-reduce: Gloo pairs over loopback TCP,
# like PyTorch's ProcessGroupGloo (the engine-against-engine row).
TCP_ENV = {"TRAINCTL_SHM": "0"}


def log(msg):
    sys.stderr.write("[%s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def run_cmd(cmd, timeout, cwd=None, env=None):
    """Runs cmd in its own process group; kills the group on timeout or on our exit."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                         env=full_env, start_new_session=True)
    CHILDREN.add(p)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(p)
        out, err = p.communicate()
        err += "\n[bench] killed after %d s" % timeout
        p.returncode = 124
    finally:
        CHILDREN.discard(p)
    return p.returncode, out, err


def stop_group(p, grace=10.0):
    """SIGTERM to p's process group (trainctl stops its job), SIGKILL after `grace` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        if p.poll() is not None:
            # the leader is gone; make sure nothing else of its group is left
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


def kill_children(*_):
    for p in list(CHILDREN):
        stop_group(p, grace=5.0)


def on_signal(signum, _frame):
    kill_children()
    sys.exit(128 + signum)


# ------------------------------------------------------------ configurations

# The hooks line: (label, ddp.comm_hook, PowerSGD rank). PowerSGD starts compressing at
# HOOK_POWERSGD_START (after the first timing window) on both sides, not at PyTorch's default 1000.
HOOKS = [("none", "none", None), ("fp16_compress", "fp16_compress", None), ("bf16_compress", "bf16_compress", None),
         ("powersgd, rank 1", "powersgd", 1), ("powersgd, rank 4", "powersgd", 4)]
HOOK_POWERSGD_START = 20
PY_HOOK_FAILS = {"bf16_compress": "no bfloat16 all-reduce in Gloo, torch 1.13",
                 "powersgd": "torch 1.13's powerSGD_hook over Gloo aborts (gloo tcp/pair.cc enforce)"}

def configs(quick):
    """name -> dict. `steps` = optimizer steps per rank per run (one epoch)."""
    s = (lambda full, small: small if quick else full)
    return {
        "linear": dict(title="Linear(5→2), batch 30, synthetic", model="linear", input_dim=5, hidden=[],
                       classes=2, batch=30, steps=s(3000, 100), window=s(100, 20), goal=3.0),
        "mlp": dict(title="MLP 256→1024→1024→1024→10 (2.37 M), batch 64, synthetic", model="mlp",
                    input_dim=256, hidden=[1024, 1024, 1024], classes=10, batch=64, steps=s(200, 30),
                    window=s(20, 5), goal=1.0),
        "cnn": dict(title="CNN (BN) on Fashion-MNIST, batch 64", model="cnn", classes=10, batch=64,
                    steps=s(200, 15), window=s(20, 5), goal=1.0),
        # Loss curves and accuracy: the whole Fashion-MNIST training set, evaluated on the test set.
        "curve": dict(title="CNN (BN) on all of Fashion-MNIST, %d epochs, batch 64" % s(2, 1), model="cnn",
                      classes=10, batch=64, epochs=s(2, 1), window=s(10, 5), full_fmnist=True,
                      train_limit=None if not quick else 15 * 64 * 2),
        # The hooks line: config 2's MLP, several epochs over one small set, so that the loss falls
        # (the labels are random: the MLP learns them by heart) and shows what a hook costs the optimizer.
        "hooks": dict(title="MLP 256→1024→1024→1024→10 (2.37 M), batch 64, synthetic", model="mlp",
                      input_dim=256, hidden=[1024, 1024, 1024], classes=10, batch=64, steps=s(20, 5),
                      epochs=s(10, 2), window=s(20, 5), goal=1.0),
        # Launch to first optimizer step: a tiny job, a metric point after every step.
        "startup": dict(title="Linear(5→2), batch 30, 20 steps", model="linear", input_dim=5, hidden=[],
                        classes=2, batch=30, steps=20, window=1),
    }


def write_idx_subset(src_images, src_labels, n, dst_dir):
    """The first n Fashion-MNIST training samples as uncompressed IDX files."""
    def sub(src, dst, per_item):
        with gzip.open(src, "rb") as f:
            raw = f.read()
        ndim = raw[3]
        dims = list(struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim]))
        dims[0] = n
        body = raw[4 + 4 * ndim: 4 + 4 * ndim + n * per_item]
        with open(dst, "wb") as f:
            f.write(raw[:4] + struct.pack(">" + "I" * ndim, *dims) + body)
    img = os.path.join(dst_dir, "fmnist-train-images-idx3-ubyte")
    lab = os.path.join(dst_dir, "fmnist-train-labels-idx1-ubyte")
    sub(src_images, img, 28 * 28)
    sub(src_labels, lab, 1)
    return img, lab


def data_for(cfg, world, workdir):
    """(length, idx files or None): one epoch of cfg['steps'] steps per rank."""
    if cfg.get("full_fmnist"):
        if cfg.get("train_limit"):
            n = cfg["train_limit"]
        else:
            return 60000, (os.path.join(FMNIST, "train-images-idx3-ubyte.gz"),
                           os.path.join(FMNIST, "train-labels-idx1-ubyte.gz"))
    else:
        n = cfg["steps"] * cfg["batch"] * world
    if cfg["model"] != "cnn":
        return n, None
    key = ("idx", n)
    if key not in data_for.cache:
        d = os.path.join(workdir, "fmnist-%d" % n)
        os.makedirs(d, exist_ok=True)
        data_for.cache[key] = write_idx_subset(os.path.join(FMNIST, "train-images-idx3-ubyte.gz"),
                                               os.path.join(FMNIST, "train-labels-idx1-ubyte.gz"), n, d)
    return n, data_for.cache[key]


data_for.cache = {}


# ------------------------------------------------------------ trainctl side

def hook_yaml(cfg):
    """The ddp: line's extras: comm_hook (and powersgd), and gradient_as_bucket_view when cfg sets it."""
    view = ""
    if "bucket_view" in cfg:
        view = ", gradient_as_bucket_view: %s" % ("true" if cfg["bucket_view"] else "false")
    return comm_hook_yaml(cfg) + view


def comm_hook_yaml(cfg):
    hook = cfg.get("comm_hook", "none")
    if hook == "none":
        return ""
    if hook == "powersgd":
        return ", comm_hook: powersgd, powersgd: {rank: %d, start_iter: %d}" % (cfg["powersgd_rank"],
                                                                              HOOK_POWERSGD_START)
    return ", comm_hook: " + hook


def trainctl_yaml(cfg, world, bucket_mb, workdir, tag):
    n, idx = data_for(cfg, world, workdir)
    if cfg["model"] == "cnn":
        model = "{name: cnn, classes: %d, batch_norm: true}" % cfg["classes"]
        train = "{format: idx, images: %s, labels: %s}" % idx
    else:
        model = "{name: mlp, input_dim: %d, hidden: [%s], classes: %d}" % (
            cfg["input_dim"], ", ".join(str(h) for h in cfg["hidden"]), cfg["classes"])
        train = "{format: synthetic, length: %d, size: %d, classes: %d, seed: 0}" % (
            n, cfg["input_dim"], cfg["classes"])
    ckpt = os.path.join(workdir, "ckpt", tag)
    if cfg.get("full_fmnist"):
        train += "\n  eval: {format: idx, images: %s, labels: %s}" % (
            os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz"), os.path.join(FMNIST, "t10k-labels-idx1-ubyte.gz"))
    text = """name: bench-ddp-%s
world_size: %d
device: cpu
backend: gloo
model: %s
data:
  train: %s
  batch_size: %d
  shuffle: true
  seed: 0
  drop_last: false
  num_workers: 0
training:
  epochs: %d
  loss: cross_entropy
  optimizer: {name: adam, lr: 0.001}
ddp: {bucket_cap_mb: %s, broadcast_buffers: true, find_unused_parameters: false%s}
checkpoint: {dir: %s, every_epochs: 0, keep: 1}
restart: {max_restarts: 0}
metrics: {every_steps: %d}
""" % (re.sub(r"[^a-z0-9-]", "-", tag.lower())[:40].strip("-"), world, model, train, cfg["batch"],
       cfg.get("epochs", 1), ("%g" % bucket_mb), hook_yaml(cfg), ckpt, cfg["window"])
    path = os.path.join(workdir, "job-%s.yaml" % tag)
    with open(path, "w") as f:
        f.write(text)
    return path


def parse_ts(text):
    """Unix seconds of an RFC 3339 UTC timestamp as protobuf's JSON writes it (up to 9 digits)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", text or "")
    if not m:
        return None
    base = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return base.timestamp() + (float("0." + m.group(2)) if m.group(2) else 0.0)


def run_trainctl(build, cfg, world, bucket_mb, warmup, workdir, tag, timeout, env=None, coordinator=None):
    """`trainctl run` (embedded coordinator + worker), or `submit --follow` to `coordinator`."""
    yaml_path = trainctl_yaml(cfg, world, bucket_mb, workdir, tag)
    trainctl = os.path.join(build, "client", "trainctl")
    if coordinator:
        cmd = [trainctl, "--coordinator", coordinator, "-o", "json", "submit", yaml_path, "--follow"]
    else:
        cmd = [trainctl, "-o", "json", "run", yaml_path,
               "--rank-binary", os.path.join(build, "worker", "trainer", "trainctl-rank")]
    launch_unix = time.time()
    t0 = time.monotonic()
    rc, out, err = run_cmd(cmd, timeout, cwd=workdir, env=env)
    wall = time.monotonic() - t0
    with open(os.path.join(workdir, "trainctl-%s.jsonl" % tag), "w") as f:
        f.write(out)
    shutil.rmtree(os.path.join(workdir, "ckpt", tag), ignore_errors=True)
    points = []
    state = None
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "metrics" in d:
            points += d["metrics"].get("points", [])
        if "job" in d:
            state = d["job"].get("state", state)
        if "state" in d and "id" in d:
            state = d["state"]
    if rc != 0 or state != "JOB_STATE_SUCCEEDED":
        return dict(ok=False, error="rc %s state %s: %s" % (rc, state, err[-1500:]), wall_s=wall)
    ranks = []
    first_steps = []
    losses = []  # rank 0: (optimizer steps done, mean loss of the window)
    evals = [dict(epoch=int(p["eval"].get("epoch", 0)), loss=p["eval"].get("loss"),
                  accuracy=p["eval"].get("accuracy"), samples=int(p["eval"].get("samples", 0)))
             for p in points if p.get("kind") == "KIND_EPOCH_END" and p.get("rank", 0) == 0 and "eval" in p]
    for r in range(world):
        pts = sorted((p for p in points if p.get("kind") == "KIND_TRAIN" and p.get("rank", 0) == r),
                     key=lambda p: int(p.get("samplesSeen", 0)))
        if pts:
            first_steps.append(parse_ts(pts[0].get("time")))
        if r == 0:  # x: optimizer steps since the start (step counts within its epoch)
            losses = [(int(p.get("epoch", 0)) * int(p.get("stepsPerEpoch", 0)) + int(p.get("step", 0)),
                       p.get("loss")) for p in pts]
        prev, wins = 0, []
        for p in pts:
            seen = int(p.get("samplesSeen", 0))
            samples, prev = seen - prev, seen
            if int(p.get("step", 0)) % cfg["window"] != 0:
                continue  # partial last window (Python drops it too)
            sps = p.get("samplesPerSec", 0.0)
            if sps <= 0:
                continue
            wins.append(dict(samples=samples, secs=samples / sps, sps=sps, data=p.get("dataMs", 0.0),
                             compute=p.get("computeMs", 0.0), comm=p.get("commMs", 0.0)))
        steady = wins[warmup:]
        if not steady:
            return dict(ok=False, error="rank %d: %d windows, none after warm-up" % (r, len(wins)), wall_s=wall)
        samples = sum(w["samples"] for w in steady)
        secs = sum(w["secs"] for w in steady)
        n = len(steady)
        ranks.append(dict(rank=r, samples_per_sec=samples / secs,
                          step_ms=1e3 * secs * cfg["batch"] / samples,
                          data_ms=sum(w["data"] for w in steady) / n,
                          compute_ms=sum(w["compute"] for w in steady) / n,
                          comm_ms=sum(w["comm"] for w in steady) / n,
                          windows=[round(w["sps"], 1) for w in wins]))
    first_step = (max(first_steps) - launch_unix) if first_steps and None not in first_steps else None
    return dict(ok=True, wall_s=wall, ranks=ranks, first_step_s=first_step, losses=losses, evals=evals,
                samples_per_sec_sum=sum(r["samples_per_sec"] for r in ranks),
                step_ms_mean=statistics.mean(r["step_ms"] for r in ranks),
                comm_ms_mean=statistics.mean(r["comm_ms"] for r in ranks),
                data_ms_mean=statistics.mean(r["data_ms"] for r in ranks),
                compute_ms_mean=statistics.mean(r["compute_ms"] for r in ranks))


# ------------------------------------------------------------ Python side

def run_python(cfg, world, bucket_mb, warmup, workdir, tag, timeout, env=None):
    n, idx = data_for(cfg, world, workdir)
    cmd = [PY, os.path.join(HERE, "pytorch_ddp.py"), "--model", cfg["model"], "--classes", str(cfg["classes"]),
           "--batch", str(cfg["batch"]), "--epochs", "1", "--seed", "0", "--lr", "0.001",
           "--bucket-mb", "%g" % bucket_mb, "--window", str(cfg["window"]), "--warmup-windows", str(warmup),
           "--threads", "1", "--nproc", str(world), "--timeout", str(timeout - 5)]
    cmd[cmd.index("--epochs") + 1] = str(cfg.get("epochs", 1))
    if cfg.get("comm_hook", "none") != "none":
        cmd += ["--comm-hook", cfg["comm_hook"]]
        if cfg["comm_hook"] == "powersgd":
            cmd += ["--powersgd-rank", str(cfg["powersgd_rank"]), "--powersgd-start-iter", str(HOOK_POWERSGD_START)]
    if cfg["model"] == "cnn":
        cmd += ["--batch-norm", "--data", "idx", "--images", idx[0], "--labels", idx[1]]
        if cfg.get("full_fmnist"):
            cmd += ["--eval-images", os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz"),
                    "--eval-labels", os.path.join(FMNIST, "t10k-labels-idx1-ubyte.gz")]
    else:
        cmd += ["--input-dim", str(cfg["input_dim"]), "--hidden", ",".join(str(h) for h in cfg["hidden"]),
                "--data", "synthetic", "--length", str(n), "--data-seed", "0"]
    t0 = time.monotonic()
    rc, out, err = run_cmd(cmd, timeout, cwd=workdir, env=env)
    wall = time.monotonic() - t0
    with open(os.path.join(workdir, "python-%s.json" % tag), "w") as f:
        f.write(out)
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"ok": False}
    if rc != 0 or not res.get("ok"):
        return dict(ok=False, error="rc %s: %s" % (rc, err[-1500:]), wall_s=wall)
    res["wall_s"] = wall
    firsts = [r.get("first_step_unix") for r in res["ranks"]]
    res["first_step_s"] = (max(firsts) - res["launch_unix"]) if firsts and None not in firsts else None
    r0 = min(res["ranks"], key=lambda r: r["rank"])
    res["losses"] = [tuple(x) for x in r0.get("window_losses", [])]
    res["evals"] = r0.get("evals", [])
    return res


# ------------------------------------------------------------ measurement

def measure(args, label, cfg, world, bucket_mb, sides=("trainctl", "python"), runs=None, env=None, coordinator=None):
    runs = runs or args.runs
    out = {s: [] for s in sides}
    for i in range(runs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))  # alternate who goes first
        for side in order:
            tag = "%s-w%d-b%g-%s-%d" % (label, world, bucket_mb, side, i)
            if side == "trainctl":
                r = run_trainctl(args.build, cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag,
                                 args.run_timeout, env)
            elif side == "trainctl-tcp":
                r = run_trainctl(args.build, cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag,
                                 args.run_timeout, dict(env or {}, **TCP_ENV))
            elif side in ("trainctl-base", "trainctl-base-tcp"):
                r = run_trainctl(args.baseline_build, cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag,
                                 args.run_timeout, dict(env or {}, **TCP_ENV) if side.endswith("-tcp") else env)
            elif side == "trainctl-submit":
                r = run_trainctl(args.build, cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag,
                                 args.run_timeout, env, coordinator=coordinator)
            elif side == "python":
                # The allocator tuned as trainctl-rank tunes its own (see MALLOC_ENV).
                r = run_python(cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag, args.run_timeout,
                               dict(env or {}, **MALLOC_ENV))
            else:  # "python-default": glibc's default allocator thresholds
                r = run_python(cfg, world, bucket_mb, args.warmup_windows, args.workdir, tag, args.run_timeout,
                               env)
            if r["ok"]:
                first = r.get("first_step_s")
                log("%-28s %-8s run %d: %10.1f samples/s  step %.3f ms  (wall %.1f s, first step %s s)" % (
                    label + " w%d b%g" % (world, bucket_mb), side, i + 1, r["samples_per_sec_sum"],
                    r["step_ms_mean"], r["wall_s"], "%.2f" % first if first is not None else "?"))
            else:
                log("%s %s run %d FAILED: %s" % (label, side, i + 1, r["error"]))
            out[side].append(r)
    return out


def final_loss(results):
    """Median over runs of rank 0's training loss in the last full window."""
    vals = [r["losses"][-1][1] for r in results if r.get("ok") and r.get("losses") and r["losses"][-1][1] is not None]
    return statistics.median(vals) if vals else None


def med(results, key):
    vals = [r[key] for r in results if r.get("ok") and key in r]
    return statistics.median(vals) if vals else None


def fmt(v, digits=0):
    if v is None:
        return "n/a"
    return "{:,.{d}f}".format(v, d=digits)


def machine_info():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return dict(cores=os.cpu_count(), cpu=cpu, blas=blas, kernel=platform.release())


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except Exception:
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runs-extra", type=int, default=3, help="runs per side for the bucket sweep and malloc lines")
    ap.add_argument("--warmup-windows", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny runs, results not written")
    ap.add_argument("--only", default="", help="comma-separated subset: linear,mlp,cnn,scaling,buckets,malloc,"
                    "startup,curve,hooks,builds (hooks and builds: their own sections, not in the default set)")
    ap.add_argument("--baseline-build", default="",
                    help="with --only builds: an older commit's build dir, run side by side with BUILD on the "
                    "linear and mlp configurations")
    ap.add_argument("--results", default=os.path.join(REPO, "bench", "RESULTS.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--run-timeout", type=int, default=180)
    ap.add_argument("--budget-s", type=int, default=1140, help="skip the extras when this much has been used")
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    args.build = os.path.abspath(args.build)
    args.baseline_build = os.path.abspath(args.baseline_build) if args.baseline_build else ""
    for build in filter(None, (args.build, args.baseline_build)):
        for b in ("client/trainctl", "worker/trainer/trainctl-rank"):
            if not os.access(os.path.join(build, b), os.X_OK):
                sys.exit("missing %s/%s (ninja -C %s trainctl trainctl-rank)" % (build, b, build))
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="bench-ddp-")
    os.makedirs(args.workdir, exist_ok=True)
    if args.quick:
        args.runs = args.runs_extra = 1
        args.warmup_windows = 1
    only = set(x for x in args.only.split(",") if x) or {"linear", "mlp", "cnn", "scaling", "buckets", "malloc",
                                                         "startup", "curve"}
    cfgs = configs(args.quick)
    start = time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    log("work dir %s; load average %s" % (args.workdir, load_before))

    main_rows = []
    raw = {"configs": {}, "scaling": {}, "buckets": {}}
    for name in ("linear", "mlp", "cnn"):
        if name not in only:
            continue
        cfg = cfgs[name]
        res = measure(args, name, cfg, 2, 25, sides=("trainctl", "trainctl-tcp", "python"))
        raw["configs"][name] = res
        tc, py = med(res["trainctl"], "samples_per_sec_sum"), med(res["python"], "samples_per_sec_sum")
        tcp = med(res["trainctl-tcp"], "samples_per_sec_sum")
        ratio = tc / py if tc and py else None
        main_rows.append(dict(name=name, cfg=cfg, tc=tc, py=py, ratio=ratio, tcp=tcp,
                              tcp_ratio=(tcp / py if tcp and py else None),
                              tcp_step=med(res["trainctl-tcp"], "step_ms_mean"),
                              tcp_comm=med(res["trainctl-tcp"], "comm_ms_mean"),
                              runs_tcp=[round(r["samples_per_sec_sum"]) for r in res["trainctl-tcp"] if r["ok"]],
                              tc_step=med(res["trainctl"], "step_ms_mean"),
                              py_step=med(res["python"], "step_ms_mean"),
                              tc_comm=med(res["trainctl"], "comm_ms_mean"),
                              tc_data=med(res["trainctl"], "data_ms_mean"),
                              tc_compute=med(res["trainctl"], "compute_ms_mean"),
                              py_bwd=statistics.median([statistics.mean(x["backward_ms"] for x in r["ranks"])
                                                        for r in res["python"] if r.get("ok")] or [0]),
                              runs_tc=[round(r["samples_per_sec_sum"]) for r in res["trainctl"] if r["ok"]],
                              runs_py=[round(r["samples_per_sec_sum"]) for r in res["python"] if r["ok"]],
                              passed=(ratio is not None and ratio >= cfg["goal"])))

    def over_budget(what):
        used = time.monotonic() - start
        if used > args.budget_s:
            log("skipping %s: %.0f s used of the %d s budget" % (what, used, args.budget_s))
            return True
        return False

    scaling = None
    if "scaling" in only and not over_budget("scaling"):
        cfg = dict(cfgs["mlp"])
        one = measure(args, "mlp-1rank", cfg, 1, 25)
        raw["scaling"]["w1"] = one
        two = raw["configs"].get("mlp") or measure(args, "mlp", cfg, 2, 25)
        raw["scaling"]["w2"] = two
        scaling = {}
        for side in ("trainctl", "python"):
            s1, s2 = med(one[side], "step_ms_mean"), med(two[side], "step_ms_mean")
            scaling[side] = dict(step1=s1, step2=s2, eff=(s1 / s2 if s1 and s2 else None))

    buckets = []
    if "buckets" in only and not over_budget("bucket sweep"):
        cfg = cfgs["mlp"]
        for mb in (1, 5, 25, 100):
            if mb == 25 and "mlp" in raw["configs"]:
                res = raw["configs"]["mlp"]
            else:
                if over_budget("bucket %g MB" % mb):
                    break
                res = measure(args, "mlp-bucket", cfg, 2, mb, runs=args.runs_extra)
            raw["buckets"][str(mb)] = res
            buckets.append(dict(mb=mb, tc=med(res["trainctl"], "samples_per_sec_sum"),
                                py=med(res["python"], "samples_per_sec_sum"),
                                tc_comm=med(res["trainctl"], "comm_ms_mean"),
                                tc_step=med(res["trainctl"], "step_ms_mean")))

    malloc_rows = []
    if "malloc" in only and not over_budget("default-allocator lines"):
        for name in ("mlp", "cnn"):
            if over_budget("default allocator %s" % name):
                break
            res = measure(args, name + "-pydefault", cfgs[name], 2, 25, sides=("python-default",),
                          runs=args.runs_extra)
            raw.setdefault("python_default_allocator", {})[name] = res
            base = raw["configs"].get(name, {"python": []})
            malloc_rows.append(dict(name=name, py=med(base["python"], "samples_per_sec_sum"),
                                    py0=med(res["python-default"], "samples_per_sec_sum")))

    startup = None
    if "startup" in only and not over_budget("startup"):
        coordinator, cluster = start_cluster(args.build, args.workdir)
        try:
            startup = measure(args, "startup", cfgs["startup"], 2, 25,
                              sides=("trainctl", "trainctl-submit", "python"), coordinator=coordinator)
        finally:
            for p in cluster:
                stop_group(p, grace=5.0)
        raw["startup"] = startup

    curve = None
    if "curve" in only and not over_budget("loss curves"):
        curve = measure(args, "curve", cfgs["curve"], 2, 25, runs=1)
        raw["curve"] = curve

    hooks = []
    if "hooks" in only:
        for label, hook, prank in HOOKS:
            if over_budget("hook %s" % label):
                break
            cfg = dict(cfgs["hooks"], comm_hook=hook, powersgd_rank=prank)
            # Not on the Python side: Gloo in Debian's torch 1.13 has no bfloat16 all-reduce ("Invalid scalar
            # type"), and its powerSGD_hook over Gloo aborts in the first compressed step (gloo's tcp/pair.cc
            # "op.preamble.length <= op.nbytes": the P and Q all-reduces' messages cross).
            sides = ("trainctl", "trainctl-tcp") if hook in PY_HOOK_FAILS else ("trainctl", "trainctl-tcp", "python")
            res = measure(args, "hook-" + re.sub(r"[^a-z0-9]+", "-", label), cfg, 2, 25, sides=sides,
                          runs=args.runs_extra)
            raw.setdefault("hooks", {})[label] = res
            row = dict(label=label, hook=hook)
            for side in sides:
                row[side] = dict(step=med(res[side], "step_ms_mean"), sps=med(res[side], "samples_per_sec_sum"),
                                 loss=final_loss(res[side]))
            hooks.append(row)

    builds = []
    if "builds" in only:
        if not args.baseline_build:
            sys.exit("--only builds needs --baseline-build DIR")
        for name in ("linear", "mlp"):
            if over_budget("builds %s" % name):
                break
            sides = ("trainctl", "trainctl-base", "trainctl-tcp", "trainctl-base-tcp", "python")
            res = measure(args, "builds-" + name, cfgs[name], 2, 25, sides=sides)
            raw.setdefault("builds", {})[name] = res
            builds.append(dict(name=name, cfg=cfgs[name], **{
                side: dict(sps=med(res[side], "samples_per_sec_sum"), step=med(res[side], "step_ms_mean"),
                           comm=med(res[side], "comm_ms_mean"),
                           runs=[round(r["samples_per_sec_sum"]) for r in res[side] if r["ok"]]) for side in sides}))

    load_after = loadavg()
    elapsed = time.monotonic() - start
    with open(os.path.join(args.workdir, "results.json"), "w") as f:
        json.dump(raw, f, indent=1, default=str)

    # ------------------------------------------------------------ report
    lines = []
    lines.append("| configuration | trainctl, shared memory (samples/s) | trainctl, TCP | PyTorch DDP, TCP "
                 "| ratio (shared memory) | ratio (TCP: engine vs engine) | goal | result |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in main_rows:
        lines.append("| %s | %s | %s | %s | %s× | %s× | ≥ %g× | %s |" % (
            r["cfg"]["title"], fmt(r["tc"]), fmt(r["tcp"]), fmt(r["py"]), fmt(r["ratio"], 2),
            fmt(r["tcp_ratio"], 2), r["cfg"]["goal"], "PASS" if r["passed"] else "FAIL"))
    detail = []
    detail.append("| configuration | side | step ms | split (ms/step) | runs (samples/s, summed over ranks) |")
    detail.append("| --- | --- | --- | --- | --- |")
    for r in main_rows:
        share = r["tc_comm"] / r["tc_step"] if r["tc_comm"] is not None and r["tc_step"] else None
        detail.append("| %s | trainctl | %s | data %s, compute %s, exposed comm %s (%s of the step) | %s |" % (
            r["name"], fmt(r["tc_step"], 3), fmt(r["tc_data"], 3), fmt(r["tc_compute"], 3), fmt(r["tc_comm"], 3),
            ("%.0f%%" % (100 * share)) if share is not None else "n/a", " / ".join(fmt(x) for x in r["runs_tc"])))
        detail.append("| %s | trainctl, TCP | %s | exposed comm %s | %s |" % (
            r["name"], fmt(r["tcp_step"], 3), fmt(r["tcp_comm"], 3), " / ".join(fmt(x) for x in r["runs_tcp"])))
        detail.append("| %s | PyTorch | %s | backward incl. all-reduce wait %s | %s |" % (
            r["name"], fmt(r["py_step"], 3), fmt(r["py_bwd"], 3), " / ".join(fmt(x) for x in r["runs_py"])))
    extra = []
    if scaling:
        extra.append("| 2-rank scaling efficiency, config 2 (1-rank step ÷ 2-rank step, batch 64/rank) | side | 1-rank step ms | 2-rank step ms | efficiency | goal | result |")
        extra.append("| --- | --- | --- | --- | --- | --- | --- |")
        for side in ("trainctl", "python"):
            s = scaling[side]
            goal = "≥ 85%" if side == "trainctl" else ""
            res = ("PASS" if s["eff"] and s["eff"] >= 0.85 else "FAIL") if side == "trainctl" else ""
            extra.append("| | %s | %s | %s | %s | %s | %s |" % (
                "trainctl" if side == "trainctl" else "PyTorch DDP", fmt(s["step1"], 2), fmt(s["step2"], 2),
                ("%.0f%%" % (100 * s["eff"])) if s["eff"] else "n/a", goal, res))
    if malloc_rows:
        extra.append("")
        extra.append("| PyTorch DDP with glibc's default allocator (diagnostic, see notes) | samples/s with `%s` (headline) | with glibc's defaults |" % " ".join("%s=%s" % kv for kv in MALLOC_ENV.items()))
        extra.append("| --- | --- | --- |")
        for m in malloc_rows:
            extra.append("| %s | %s | %s |" % (m["name"], fmt(m["py"]), fmt(m["py0"])))
    if buckets:
        extra.append("")
        extra.append("| bucket_cap_mb (config 2) | trainctl samples/s | trainctl exposed comm ms/step | PyTorch DDP samples/s | ratio |")
        extra.append("| --- | --- | --- | --- | --- |")
        for b in buckets:
            extra.append("| %g | %s | %s | %s | %s× |" % (b["mb"], fmt(b["tc"]), fmt(b["tc_comm"], 2), fmt(b["py"]),
                                                       fmt(b["tc"] / b["py"] if b["tc"] and b["py"] else None, 2)))

    if startup:
        extra.append("")
        extra.append("| launch → first optimizer step, 2 ranks (%s) | median s | runs (s) | whole job, median wall s |" %
                     cfgs["startup"]["title"])
        extra.append("| --- | --- | --- | --- |")
        names = {"trainctl": "`trainctl run` (starts its own coordinator and worker daemon)",
                 "trainctl-submit": "`trainctl submit --follow` to a running coordinator + worker daemon",
                 "python": "Python launcher (Popen of 2 ranks with the env contract, as torchrun does)"}
        for side in ("trainctl-submit", "trainctl", "python"):
            firsts = [r["first_step_s"] for r in startup[side] if r.get("ok") and r.get("first_step_s") is not None]
            extra.append("| %s | %s | %s | %s |" % (
                names[side], fmt(statistics.median(firsts), 2) if firsts else "n/a",
                " / ".join("%.2f" % x for x in firsts), fmt(med(startup[side], "wall_s"), 2)))
    if curve:
        extra.append("")
        extra.append("| %s | side | samples/s | test accuracy per epoch | test loss per epoch |" % cfgs["curve"]["title"])
        extra.append("| --- | --- | --- | --- | --- |")
        for side in ("trainctl", "python"):
            r = next((x for x in curve[side] if x.get("ok")), None)
            if r is None:
                extra.append("| | %s | failed | | |" % side)
                continue
            ev = sorted(r.get("evals", []), key=lambda e: e["epoch"])
            extra.append("| | %s | %s | %s | %s |" % (
                "trainctl" if side == "trainctl" else "PyTorch DDP", fmt(r["samples_per_sec_sum"]),
                " / ".join("%.4f" % e["accuracy"] for e in ev), " / ".join("%.4f" % e["loss"] for e in ev)))
    hook_lines = hooks_table(hooks, cfgs["hooks"], args.runs_extra, args.warmup_windows) if hooks else []
    build_lines = builds_table(builds, args) if builds else []
    main_run = bool(only - {"hooks", "builds"})
    if main_run:
        print("\n".join(lines))
        print()
        print("\n".join(detail))
    if hook_lines:
        print()
        print("\n".join(hook_lines))
    if build_lines:
        print()
        print("\n".join(build_lines))
    if extra:
        print()
        print("\n".join(extra))
    print("\nload average %s before, %s after; %.0f s; raw results in %s" % (load_before, load_after, elapsed,
                                                                           args.workdir))
    if args.quick or args.no_write:
        return 0
    mi = machine_info()
    if hook_lines:
        hsec = [HOOKS_SECTION, "",
                "Run %s by `bench/ddp/run.sh --only hooks` (commit %s, %.0f s in all). Machine: %d cores (%s); load "
                "average %s at the start, %s at the end." % (
                    started_at.strftime("%Y-%m-%dT%H:%MZ"), git_commit(), elapsed, mi["cores"], mi["cpu"],
                    load_before, load_after), ""] + hook_lines
        write_section(args.results, "\n".join(hsec) + "\n", HOOKS_SECTION)
        log("wrote the hooks section of %s" % args.results)
    if build_lines:
        bsec = [BUILDS_SECTION, "",
                "Run %s by `bench/ddp/run.sh BUILD --only builds --baseline-build OLD` (%.0f s in all). Machine: %d "
                "cores (%s); load average %s at the start, %s at the end." % (
                    started_at.strftime("%Y-%m-%dT%H:%MZ"), elapsed, mi["cores"], mi["cpu"], load_before,
                    load_after), ""] + build_lines
        write_section(args.results, "\n".join(bsec) + "\n", BUILDS_SECTION)
        log("wrote the builds section of %s" % args.results)
    if not main_run:
        return 0

    write_plot_data(os.path.join(REPO, "bench", "plots"), main_rows, curve)
    plot = subprocess.run(["bash", os.path.join(REPO, "bench", "plot.sh")], capture_output=True, text=True)
    if plot.returncode != 0:
        log("bench/plot.sh failed: %s" % plot.stderr.strip()[-500:])

    steps_note = ", ".join("%s %d steps/rank/run (window %d)" % (n, cfgs[n]["steps"], cfgs[n]["window"])
                           for n in ("linear", "mlp", "cnn") if n in only)
    sec = [SECTION, ""]
    sec.append("Run %s by `bench/ddp/run.sh` (commit %s, build `%s`, %.0f s in all)." % (
        started_at.strftime("%Y-%m-%dT%H:%MZ"), git_commit(), os.path.relpath(args.build, REPO)
        if args.build.startswith(REPO) else args.build, elapsed))
    shared = float(load_before) > 1.0 or float(load_after) > 1.0
    sec.append("Machine: %d cores (%s), BLAS %s (`libopenblas0-openmp`, what Debian's LibTorch 1.13 loads), "
               "loopback only; Debian torch 1.13.1 on both sides. Load average %s at the start, %s at the end%s." % (
                   mi["cores"], mi["cpu"], mi["blas"], load_before, load_after,
                   " (each 2-rank run itself keeps both cores busy, so the load includes the bench; "
                   "anything above ~2.5 means another job was sharing the machine and adds noise)" if shared else ""))
    sec.append("Both sides: 2 ranks, Gloo, 1 intra-op thread per rank, Adam lr 1e-3, cross-entropy, "
               "DistributedSampler(shuffle, seed 0), num_workers 0, bucket 25 MB, one epoch per run; "
               "%s; median of %d runs per side (the sides take turns going first). "
               "Timing on both sides: per-rank windows of W optimizer steps (data + forward + backward + "
               "all-reduce wait + optimizer), first %d windows dropped as warm-up, partial last window dropped; "
               "samples/s = samples ÷ seconds over the rest, summed over the 2 ranks. trainctl's numbers are its "
               "own `samples_per_sec`/`data_ms`/`compute_ms`/`comm_ms` metric points (`trainctl -o json run`)." % (
                   steps_note, args.runs, args.warmup_windows))
    sec.append("")
    sec.append("Plots (drawn by `bench/plot.sh` from this run): [throughput per configuration](plots/throughput.png), "
               "[training loss, CNN on Fashion-MNIST, trainctl vs Python](plots/loss-cnn.png).")
    sec.append("")
    sec += lines
    sec.append("")
    sec += detail
    if extra:
        sec.append("")
        sec += extra
    sec.append("")
    sec.append("Notes:")
    notes_path = os.path.join(HERE, "NOTES.md")
    if os.path.exists(notes_path):
        sec += [l.rstrip("\n") for l in open(notes_path) if l.strip() and not l.startswith("#")]
    sec.append("- Raw per-run numbers: `results.json` in the run's work directory (printed by run.sh).")
    write_section(args.results, "\n".join(sec) + "\n", SECTION)
    log("wrote %s" % args.results)
    return 0


def build_commit(build):
    """The commit a build dir was configured from (its CMake source dir's HEAD)."""
    try:
        src = next(l.split("=", 1)[1].strip() for l in open(os.path.join(build, "CMakeCache.txt"))
                   if l.startswith("CMAKE_HOME_DIRECTORY:"))
        return subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "?"
    except (OSError, StopIteration, subprocess.SubprocessError):
        return "?"


def builds_table(builds, args):
    """Two builds of trainctl side by side in one run, each against the same PyTorch runs."""
    new, old = build_commit(args.build), build_commit(args.baseline_build)
    out = ["Both builds run the same jobs in turn with PyTorch DDP (the sides alternate who goes first; median of "
           "%d runs each): `%s` (commit %s) and `%s` (commit %s). Same settings as the main table "
           "(2 ranks, Gloo, 1 thread per rank, bucket 25 MB)." % (
               args.runs, os.path.relpath(args.build, REPO) if args.build.startswith(REPO) else args.build, new,
               args.baseline_build, old), "",
           "| configuration | side | samples/s | step ms | exposed comm ms | ratio to PyTorch | runs |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    names = {"trainctl": "%s, shared memory" % new, "trainctl-base": "%s, shared memory" % old,
             "trainctl-tcp": "%s, TCP" % new, "trainctl-base-tcp": "%s, TCP" % old, "python": "PyTorch DDP, TCP"}
    for b in builds:
        py = b["python"]["sps"]
        for side in ("trainctl", "trainctl-base", "trainctl-tcp", "trainctl-base-tcp", "python"):
            r = b[side]
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                b["name"], names[side], fmt(r["sps"]), fmt(r["step"], 3),
                fmt(r["comm"], 3) if side != "python" else "", (fmt(r["sps"] / py, 2) + "×") if r["sps"] and py else "n/a",
                " / ".join(fmt(x) for x in r["runs"])))
    return out


def hooks_table(hooks, cfg, runs, warmup):
    """The hooks line: each hook next to no hook, on both transports and (where it can) in PyTorch."""
    base = hooks[0] if hooks and hooks[0]["label"] == "none" else None
    out = ["The MLP of config 2 (%s, 2 ranks, Adam lr 1e-3) for %d epochs of %d steps/rank over the same %d "
           "samples, whose labels are random: the falling loss is the MLP learning them by heart, which shows what "
           "each hook's rounding or low rank costs the optimizer. Median of %d runs per side and hook; step time "
           "over the epochs after the first %d. PowerSGD settings: error feedback and warm start on, "
           "min_compression_rate 2, start_iter %d on both sides (PyTorch's default is 1000; the run has %d steps). "
           "Final loss: rank 0's mean training loss over the last epoch (trainctl's own metric point; the Python "
           "script's own window mean), compared within a side, where no hook is the baseline of the same run." % (
               cfg["title"], cfg["epochs"], cfg["steps"], cfg["steps"] * cfg["batch"] * 2, runs, warmup,
               HOOK_POWERSGD_START, cfg["steps"] * cfg["epochs"]), "",
           "| ddp.comm_hook | trainctl shm: step ms | final loss | trainctl TCP: step ms | final loss "
           "| PyTorch DDP (TCP): step ms | final loss |",
           "| --- | --- | --- | --- | --- | --- | --- |"]

    def cell(row, side, key, digits):
        v = row.get(side, {}).get(key)
        if v is None:
            return "n/a"
        text = fmt(v, digits)
        b = base.get(side, {}).get(key) if base and row is not base and key == "step" else None
        if b:
            text += " (%+.0f%%)" % (100.0 * (v - b) / b)
        return text

    for row in hooks:
        py_step = cell(row, "python", "step", 2) if "python" in row else "n/a (%s)" % PY_HOOK_FAILS[row["hook"]]
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            row["label"], cell(row, "trainctl", "step", 2), cell(row, "trainctl", "loss", 4),
            cell(row, "trainctl-tcp", "step", 2), cell(row, "trainctl-tcp", "loss", 4), py_step,
            cell(row, "python", "loss", 4)))
    return out


def start_cluster(build, workdir):
    """A coordinator and a 2-slot worker daemon on loopback; returns (address, processes)."""
    d = os.path.join(workdir, "cluster")
    os.makedirs(d, exist_ok=True)
    admin_file = os.path.join(d, "admin.token")
    coord = subprocess.Popen([os.path.join(build, "coordinator", "trainctl-coordinator"), "--listen", "127.0.0.1:0",
                              "--db", os.path.join(d, "state.db"), "--admin-token-file", admin_file],
                             stdout=subprocess.PIPE,
                             stderr=open(os.path.join(d, "coordinator.log"), "w"), text=True, start_new_session=True)
    CHILDREN.add(coord)
    line = coord.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        raise SystemExit("coordinator did not start: %r" % line)
    addr = m.group(1)
    # Every call needs a token: the CLI calls of this run use the admin
    # token the coordinator wrote ($TRAINCTL_TOKEN), the worker its own.
    os.environ["TRAINCTL_TOKEN"] = open(admin_file).read().strip()
    rc, out, err = run_cmd([os.path.join(build, "client", "trainctl"), "--coordinator", addr, "-o", "json",
                            "token", "create", "--role", "worker", "--name", "bench-worker"], 10)
    if rc != 0:
        raise SystemExit("could not create a worker token: %s" % (err or out))
    worker_token = os.path.join(d, "worker.token")
    with open(os.open(worker_token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(json.loads(out)["secret"] + "\n")
    worker = subprocess.Popen([os.path.join(build, "worker", "daemon", "trainctl-worker"), "--coordinator", addr,
                               "--token-file", worker_token,
                               "--slots", "2", "--work-dir", os.path.join(d, "worker"),
                               "--rank-binary", os.path.join(build, "worker", "trainer", "trainctl-rank")],
                              stdout=open(os.path.join(d, "worker.log"), "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    CHILDREN.add(worker)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rc, out, _ = run_cmd([os.path.join(build, "client", "trainctl"), "--coordinator", addr, "-o", "json",
                              "workers"], 10)
        if rc == 0 and "WORKER_STATE_ALIVE" in out:
            return addr, [worker, coord]
        time.sleep(0.2)
    raise SystemExit("worker daemon did not register within 30 s")


def write_plot_data(plots, main_rows, curve):
    """Data files for bench/plot.sh (committed next to the PNGs so the plots can be redrawn)."""
    os.makedirs(plots, exist_ok=True)
    if main_rows:
        with open(os.path.join(plots, "throughput.dat"), "w") as f:
            f.write("# config trainctl_samples_per_s python_samples_per_s ratio (medians; bench/ddp/run.sh)\n")
            for r in main_rows:
                f.write('"%s" %.1f %.1f %.3f\n' % (r["name"], r["tc"] or 0, r["py"] or 0, r["ratio"] or 0))
    if curve:
        for side in ("trainctl", "python"):
            r = next((x for x in curve[side] if x.get("ok")), None)
            if r is None:
                continue
            with open(os.path.join(plots, "loss-cnn-%s.dat" % side), "w") as f:
                f.write("# optimizer_step mean_training_loss_of_the_window (rank 0)\n")
                for step, loss in r.get("losses", []):
                    if loss is not None:
                        f.write("%d %.6f\n" % (step, loss))


def write_section(path, section, heading=SECTION):
    """Replaces the `heading` section of `path` with `section` (appends it when missing)."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    start = text.find("\n" + heading + "\n")
    if text.startswith(heading + "\n"):
        start = 0
    if start >= 0:
        if start > 0:
            start += 1
        nxt = text.find("\n## ", start + len(heading))
        end = len(text) if nxt < 0 else nxt + 1
        text = text[:start] + section + ("\n" if nxt >= 0 else "") + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
