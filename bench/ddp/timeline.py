#!/usr/bin/python3
"""bench/ddp timeline: where a DDP step's time goes (issue #49).

Started by bench/ddp/timeline.sh (see there). Runs bench.py's "mlp"
configuration (its job file, its step count; nothing is restated here) with
TRAINCTL_COMM_TIMELINE set, for 1 rank, 2 ranks over shared memory and 2
ranks over TCP (TRAINCTL_SHM=0), reads the ranks' PREFIX.rankN.jsonl files
and prints, per mode, each bucket's moments (ms after the synced
micro-batch's backward started) and the step's parts. The exposed
communication is the issue's: (2-rank step - 1-rank step) / 2-rank step,
with "step" the median time from one step's start to the next's.
"""

import argparse
import datetime
import glob
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (the driver whose configurations and job files this reuses)

SECTION = "## DDP step timeline"
ENV = "TRAINCTL_COMM_TIMELINE"
LATE_ENV = {"TRAINCTL_DDP_LAUNCH_AFTER_BACKWARD": "1"}
COPY = {"bucket_view": False}  # ddp.gradient_as_bucket_view: false
MODES = {
    # name: (world size, extra environment, title, bucket_cap_mb or None for --bucket-mb,
    #        job settings over bench.py's config)
    "1rank": (1, {}, "1 rank (a 1-rank Gloo group: buckets, no peer)", None, {}),
    "shm": (2, {}, "2 ranks, shared memory", None, {}),
    "tcp": (2, dict(bench.TCP_ENV), "2 ranks, TCP (`TRAINCTL_SHM=0`)", None, {}),
    # Candidates for issue #49, measured beside the defaults (--modes).
    "1rank-copy": (1, {}, "1 rank, gradient_as_bucket_view: false", None, COPY),
    "shm-copy": (2, {}, "2 ranks, shared memory, gradient_as_bucket_view: false", None, COPY),
    "tcp-copy": (2, dict(bench.TCP_ENV), "2 ranks, TCP, gradient_as_bucket_view: false", None, COPY),
    "shm-b1": (2, {}, "2 ranks, shared memory, bucket_cap_mb 1", 1, {}),
    "tcp-b1": (2, dict(bench.TCP_ENV), "2 ranks, TCP, bucket_cap_mb 1", 1, {}),
    # No overlap: does the all-reduce during backward pay where both compete for the same cores?
    "shm-late": (2, dict(LATE_ENV), "2 ranks, shared memory, every bucket launched after backward", None, {}),
    "tcp-late": (2, dict(bench.TCP_ENV, **LATE_ENV), "2 ranks, TCP, every bucket launched after backward",
                 None, {}),
    # The floor of the 2-core machine: two 1-rank jobs started together, no communication between them.
    # What they lose against one 1-rank job alone is the two processes sharing the cores, caches and
    # memory bandwidth, which the definition counts as exposed communication too.
    "pair": (1, {}, "two 1-rank jobs at once (no communication: the cost of sharing the machine)", None, {}),
}
PAIRED = {"pair"}  # modes run as two jobs at once; their ranks are the two jobs' rank 0
# MODE@before (with --before BUILD_DIR): MODE run by that build, with its defaults (a build from before
# ddp.gradient_as_bucket_view existed takes no job settings: only modes without any).
BEFORE = "@before"


def mode_spec(m, before_build):
    """(world, env, title, bucket_mb, settings, build or None for the main one) of mode `m`."""
    base = m[:-len(BEFORE)] if m.endswith(BEFORE) else m
    if base not in MODES:
        return None
    world, env, title, bucket_mb, settings = MODES[base]
    if base == m:
        return world, env, title, bucket_mb, settings, None
    if not before_build or settings:
        return None
    return world, env, title + ", before (%s)" % before_build[1], bucket_mb, settings, before_build[0]


def baseline_of(m, have=()):
    """The 1-rank mode that mode m's exposed communication is measured against: the same build, and
    the same job settings where the run has a 1-rank mode with them (shm-copy against 1rank-copy)."""
    if m.endswith(BEFORE):
        return "1rank" + BEFORE
    for suffix in ("-copy",):
        if m.endswith(suffix) and "1rank" + suffix in have:
            return "1rank" + suffix
    return "1rank"


def log(msg):
    bench.log(msg)


def load_steps(prefix):
    """{rank: [step dict, ...]} from PREFIX.rankN.jsonl."""
    out = {}
    for path in sorted(glob.glob(prefix + ".rank*.jsonl")):
        rank = int(path[len(prefix) + len(".rank"):-len(".jsonl")])
        with open(path) as f:
            out[rank] = [json.loads(line) for line in f if line.strip()]
    return out


def summarize_runs(runs, skip):
    """One summary over several runs of a mode: each run's ranks become ranks of their own."""
    merged = {}
    for i, ranks in enumerate(runs):
        for r, steps in ranks.items():
            merged[(i, r)] = steps
    return summarize(merged, skip)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def p90(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))] if xs else None


def rel(step, key, base="backward_start"):
    """step[key] - step[base] in ms, None when either is missing."""
    a, b = step.get(key), step.get(base)
    return None if a is None or b is None else a - b


def summarize(ranks, skip):
    """Medians over the steps after the first `skip` of every rank; `ranks` is keyed (run, rank)."""
    steps = [s for r in sorted(ranks) for s in ranks[r][skip:]]
    if not steps:
        return None
    periods = []
    for r in sorted(ranks):
        ss = ranks[r][skip:]
        periods += [(b["t0_ns"] - a["t0_ns"]) / 1e6 for a, b in zip(ss, ss[1:]) if b["step"] == a["step"] + 1]
    parts = dict(
        period=med(periods), period_p90=p90(periods),
        forward=med(rel(s, "backward_start", "start") for s in steps),
        backward=med(rel(s, "backward_end") for s in steps),
        finalize=med(rel(s, "finalize_end", "backward_end") for s in steps),
        wait=med(rel(s, "wait_end", "wait_start") for s in steps),
        wait_p90=p90(rel(s, "wait_end", "wait_start") for s in steps),
        copy_back=med(rel(s, "finalize_end", "wait_end") for s in steps),
        optimizer=med(rel(s, "optimizer_end", "optimizer_start") for s in steps),
        after=med(rel(s, "end", "optimizer_end") for s in steps),
        step=med(rel(s, "end", "start") for s in steps),
        data=med(s.get("data_ms") for s in steps),
        comm=steps[0].get("comm"), steps=len(steps))
    nb = max(len(s["buckets"]) for s in steps)
    buckets = []
    for i in range(nb):
        bs = [(s, s["buckets"][i]) for s in steps if len(s["buckets"]) > i]
        b0 = bs[0][1]
        row = dict(bucket=i, floats=b0.get("bytes", 0) // 4, params=b0.get("params"))
        for key in ("ready", "issued", "started", "finished", "waited"):
            row[key] = med(None if b.get(key) is None else b[key] - s["backward_start"] for s, b in bs)
        row["run"] = med(None if b.get("started") is None or b.get("finished") is None
                         else b["finished"] - b["started"] for _, b in bs)
        buckets.append(row)
    parts["buckets"] = buckets
    # Rank skew: how much later the last rank of a run left backward than the first, per step.
    run_of = {key: key[0] for key in ranks}  # keys are (run, rank)
    per_run = {i: sum(1 for k in ranks if k[0] == i) for i in set(run_of.values())}
    if max(per_run.values()) > 1:
        by_step = {}
        for key in ranks:
            for s in ranks[key][skip:]:
                if s.get("backward_end") is not None:
                    by_step.setdefault((key[0], s["step"]), []).append(s["t0_ns"] / 1e6 + s["backward_end"])
        parts["skew"] = med(max(v) - min(v) for (i, _), v in by_step.items() if len(v) == per_run[i])
    return parts


def fmt(v, d=2):
    return "n/a" if v is None else "%.*f" % (d, v)


def table(mode, title, s, one_period):
    lines = ["**%s** (engine `%s`, %d steps after warm-up, medians; ms after the synced backward started)"
             % (title, s["comm"], s["steps"]), ""]
    if s["buckets"]:
        lines.append("| bucket | floats | params | ready | issued | reduce start | reduce end | reduce ms | waited |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for b in s["buckets"]:
            lines.append("| %d | {:,} | %s | %s | %s | %s | %s | %s | %s |".format(b["floats"]) % (
                b["bucket"], b["params"], fmt(b["ready"]), fmt(b["issued"]), fmt(b["started"]),
                fmt(b["finished"]), fmt(b["run"]), fmt(b["waited"])))
        lines.append("")
    exposed = None
    if one_period and s["period"] and not mode.startswith("1rank"):
        exposed = (s["period"] - one_period) / s["period"]
    lines.append("| data + forward | backward | end-of-backward wait (p90) | copy back | optimizer | "
                 "after (metrics) | step (start→next start, p90) | rank skew at backward end | exposed comm |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines.append("| %s | %s | %s (%s) | %s | %s | %s | %s (%s) | %s | %s |" % (
        fmt(s["forward"]), fmt(s["backward"]), fmt(s["wait"]), fmt(s["wait_p90"]), fmt(s["copy_back"]),
        fmt(s["optimizer"]), fmt(s["after"]), fmt(s["period"]), fmt(s["period_p90"]), fmt(s.get("skew")),
        "—" if mode.startswith("1rank") else ("%.1f%%" % (100 * exposed) if exposed is not None else "n/a")))
    return lines


def extra_time_table(summaries, modes):
    """Where each 2-rank mode's step is longer than the 1-rank step, part by part (ms)."""
    keys = [("forward", "data + forward"), ("backward", "backward"), ("wait", "end-of-backward wait"),
            ("copy_back", "copy back"), ("optimizer", "optimizer")]
    out = ["Where the 2-rank step's extra time goes: each part's median minus the 1-rank run's of the same build "
           "and settings (ms); *other* is "
           "the rest of the step period. Parts without communication (forward, optimizer) grow too when both "
           "ranks compute at once on the 2 cores.", "",
           "| mode | step period | " + " | ".join(k[1] for k in keys) + " | other |",
           "| --- | --- | " + " | ".join("---" for _ in keys) + " | --- |"]
    for m in modes:
        if m.startswith("1rank") or m not in summaries or baseline_of(m, summaries) not in summaries:
            continue
        s = summaries[m]
        base = summaries[baseline_of(m, summaries)]
        if s.get("period") is None or base.get("period") is None:
            continue
        diffs = [(s.get(k) - base.get(k)) if s.get(k) is not None and base.get(k) is not None else None
                 for k, _ in keys]
        total = s["period"] - base["period"]
        other = total - sum(d for d in diffs if d is not None)
        out.append("| %s | %+.2f | %s | %+.2f |" % (
            m, total, " | ".join("n/a" if d is None else "%+.2f" % d for d in diffs), other))
    return out


def floor_lines(summaries, modes):
    """With a pair mode: the issue's exposed communication of each 2-rank mode split into the cost of
    sharing the machine (pair against 1 rank) and what the communication adds beyond it (2 ranks against
    the pair)."""
    one, pair = summaries.get("1rank", {}).get("period"), summaries.get("pair", {}).get("period")
    if not one or not pair:
        return []
    out = ["Exposed communication split at the floor of this machine (periods of this run; the pair is two "
           "1-rank jobs at once, so it has every cost of two processes sharing 2 cores and none of "
           "communication):", "",
           "| mode | step | exposed (issue's definition) | of it: sharing the machine, (pair − 1 rank) ÷ step "
           "| of it: communication, (step − pair) ÷ step |", "| --- | --- | --- | --- | --- |",
           "| pair | %.2f | %.1f%% | %.1f%% | — |" % (pair, 100 * (pair - one) / pair, 100 * (pair - one) / pair)]
    for m in modes:
        s = summaries.get(m)
        if m in PAIRED or m.startswith("1rank") or m.endswith(BEFORE) or not s or not s.get("period"):
            continue
        p = s["period"]
        out.append("| %s | %.2f | %.1f%% | %.1f%% | %.1f%% |" % (
            m, p, 100 * (p - one) / p, 100 * (pair - one) / p, 100 * (p - pair) / p))
    return out + [""]


def run_pair(build, cfg, bucket_mb, args, tag, prefix, env):
    """Two 1-rank jobs started together (each `trainctl run` with its own coordinator and worker).
    Returns (result, {0: job a's steps, 1: job b's}); the result's step is the mean of the two."""
    out = {}

    def one(side):
        out[side] = bench.run_trainctl(build, cfg, 1, bucket_mb, 2, args.workdir, "%s-%s" % (tag, side),
                                       args.run_timeout, dict(env, **{ENV: "%s-%s" % (prefix, side)}))

    threads = [threading.Thread(target=one, args=(side,)) for side in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [out[side]["error"] for side in ("a", "b") if not out[side]["ok"]]
    if bad:
        return dict(ok=False, error="; ".join(bad)), {}
    ranks = {}
    for i, side in enumerate(("a", "b")):
        steps = load_steps("%s-%s" % (prefix, side))
        if 0 in steps:
            ranks[i] = steps[0]
    return dict(ok=True, step_ms_mean=statistics.mean(out[side]["step_ms_mean"] for side in ("a", "b"))), ranks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--modes", default="1rank,shm,tcp", help="of " + ",".join(MODES))
    ap.add_argument("--runs", type=int, default=1, help="runs per mode (modes take turns); medians pool them")
    ap.add_argument("--skip-steps", type=int, default=20, help="warm-up steps left out of the medians")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--before", default="", help="another build dir for the MODE@before modes (e.g. main's)")
    ap.add_argument("--before-label", default="", help="what --before is, for the tables (e.g. its commit)")
    ap.add_argument("--run-timeout", type=int, default=180)
    ap.add_argument("--results", default=os.path.join(bench.REPO, "bench", "RESULTS.md"))
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, bench.on_signal)
    signal.signal(signal.SIGINT, bench.on_signal)
    args.build = os.path.abspath(args.build)
    before = None
    if args.before:
        before = (os.path.abspath(args.before), args.before_label or args.before)
    for build in [args.build] + ([before[0]] if before else []):
        for b in ("client/trainctl", "worker/trainer/trainctl-rank"):
            if not os.access(os.path.join(build, b), os.X_OK):
                sys.exit("missing %s/%s (ninja -C %s trainctl trainctl-rank)" % (build, b, build))
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="bench-ddp-timeline-"))
    os.makedirs(args.workdir, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if mode_spec(m, before) is None:
            sys.exit("unknown mode %s (have %s, and MODE%s of those without job settings with --before)" % (
                m, ",".join(MODES), BEFORE))
    cfg = bench.configs(False)["mlp"]
    started_at = datetime.datetime.now(datetime.timezone.utc)
    load_before = bench.loadavg()
    log("work dir %s; load average %s" % (args.workdir, load_before))
    t_start = time.monotonic()

    runs = {m: [] for m in modes}
    metric_runs = {m: [] for m in modes}
    for i in range(args.runs):
        order = modes if i % 2 == 0 else list(reversed(modes))
        for m in order:
            world, env, _, bucket_mb, settings, build = mode_spec(m, before)
            tag = "timeline-%s-%d" % (m.replace("@", "-"), i)
            prefix = os.path.join(args.workdir, tag)
            for old in glob.glob(prefix + ".rank*.jsonl") + glob.glob(prefix + "-[ab].rank*.jsonl"):
                os.remove(old)
            if m in PAIRED:
                r, ranks = run_pair(build or args.build, dict(cfg, **settings), bucket_mb or args.bucket_mb, args,
                                    tag, prefix, env)
                world = 2
            else:
                r = bench.run_trainctl(build or args.build, dict(cfg, **settings), world,
                                       bucket_mb or args.bucket_mb, 2, args.workdir, tag, args.run_timeout,
                                       dict(env, **{ENV: prefix}))
                ranks = load_steps(prefix) if r["ok"] else {}
            if not r["ok"]:
                log("%s FAILED: %s" % (m, r["error"]))
                continue
            if len(ranks) != world:
                log("%s: %d timeline files for %d ranks under %s" % (m, len(ranks), world, prefix))
                continue
            runs[m].append(ranks)
            metric_runs[m].append(r["step_ms_mean"])
            log("%s run %d: %d steps per rank; step %.3f ms by the metrics" % (
                m, i + 1, len(ranks[0]), r["step_ms_mean"]))
    summaries = {m: summarize_runs(runs[m], args.skip_steps) for m in modes if runs[m]}
    for m in PAIRED & set(summaries):
        summaries[m]["skew"] = None  # two jobs' steps are not aligned: no skew between them
    metric_steps = {m: statistics.median(metric_runs[m]) for m in modes if metric_runs[m]}
    load_after = bench.loadavg()

    out = []
    for m in modes:
        if m in summaries:
            one = summaries.get(baseline_of(m, summaries), {}).get("period")
            out += table(m, mode_spec(m, before)[2], summaries[m], one) + [""]
    if "1rank" in summaries and len(summaries) > 1:
        out += extra_time_table(summaries, modes) + [""]
    out += floor_lines(summaries, modes)
    if metric_steps:
        out.append("Step by the ranks' own metrics (bench.py's timing, same runs, median over runs): " + ", ".join(
            "%s %.2f ms" % (m, metric_steps[m]) for m in modes if m in metric_steps) + ".")
    print("\n".join(out))
    print("\nload average %s before, %s after; %.0f s; timelines in %s" % (
        load_before, load_after, time.monotonic() - t_start, args.workdir))
    if args.no_write:
        return 0
    if len(summaries) != len(modes):
        log("not writing %s: a mode failed" % args.results)
        return 1
    mi = bench.machine_info()
    sec = [SECTION, ""]
    sec.append("Run %s by `bench/ddp/timeline.sh` (commit %s). Machine: %d cores (%s), load average %s at the "
               "start, %s at the end (a 2-rank run keeps both cores busy itself)." % (
                   started_at.strftime("%Y-%m-%dT%H:%MZ"), bench.git_commit(), mi["cores"], mi["cpu"],
                   load_before, load_after))
    sec.append("Job: bench/ddp's config 2 (%s, %d steps per rank, bucket %g MB, 1 intra-op thread per rank), "
               "%d run(s) per mode, modes taking turns, with `%s=PREFIX` (docs/ddp.md, \"Where a step's time "
               "goes\"); the first %d steps of each rank are left out. Times are medians over the remaining steps "
               "of every rank and run, in ms after the backward of the step's synced micro-batch started." % (
                   cfg["title"], cfg["steps"], args.bucket_mb, args.runs, ENV, args.skip_steps))
    sec.append("")
    sec += out
    sec.append("")
    sec.append("Columns: *ready* = the bucket's last gradient was copied into it; *issued* = its all-reduce was "
               "queued on the engine; *reduce start/end* = the engine's thread took it from its queue / finished "
               "it (for shared memory the start includes waiting at the first barrier for the peer); *waited* = "
               "the training thread's Wait() for it returned. *End-of-backward wait* = FinalizeBackward's wait for "
               "all buckets; *copy back* = the averaged buckets copied into `param.grad()`; *exposed comm* = "
               "(2-rank step − 1-rank step) ÷ 2-rank step, as issue #49 defines it.")
    bench.write_section(args.results, "\n".join(sec) + "\n", heading=SECTION)
    log("wrote %s" % args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
