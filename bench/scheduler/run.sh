#!/usr/bin/env bash
# Scheduling with queues at scale (issue #26's scenario): runs
# trainctl-bench-scheduler (a simulated cluster driving the pure scheduler,
# see bench_scheduler.cc), prints its results and writes the
# "## Scheduling with queues" section of bench/RESULTS.md.
#
#   bench/scheduler/run.sh [BUILD_DIR]      (default: build; builds nothing)
#
# Environment: RESULTS [bench/RESULTS.md], WRITE_RESULTS [1], BENCH_ARGS
# (extra flags for the binary: --workers, --slots, --queues, --cohort-size,
# --pending-per-queue, --max-size, --ticks, --warmup, --half-life, --seed;
# defaults 2,000 workers x 8 GPU slots, 20 queues in cohorts of 5, 50
# pending jobs per busy queue, jobs of 1..32 slots, 150 + 300 ticks,
# half-life 60 ticks). About a minute on an idle 2-core machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/bench/scheduler/trainctl-bench-scheduler"
[[ -x "$BIN" ]] || { echo "run.sh: $BIN not found; build the target trainctl-bench-scheduler in $BUILD" >&2; exit 2; }
RESULTS="${RESULTS:-$ROOT/bench/RESULTS.md}"
WRITE_RESULTS="${WRITE_RESULTS:-1}"
OUT="$(mktemp /tmp/trainctl-bench-scheduler.XXXXXX)"
trap 'rm -f "$OUT"' EXIT

load_start=$(cut -d' ' -f1 /proc/loadavg)
t0=$SECONDS
# shellcheck disable=SC2086
"$BIN" ${BENCH_ARGS:-} | tee "$OUT"
elapsed=$((SECONDS - t0))
load_end=$(cut -d' ' -f1 /proc/loadavg)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')

python3 - "$OUT" "$RESULTS" "$WRITE_RESULTS" "$commit" "$elapsed" "$load_start" "$load_end" "$(nproc)" "$cpu" <<'EOF'
import datetime, sys
out, results, write, commit, elapsed, l0, l1, cores, cpu = sys.argv[1:]
r = dict(line.rstrip("\n").split("=", 1) for line in open(out) if "=" in line)
f = lambda k: float(r[k])
SECTION = "## Scheduling with queues"
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
rows = []
def row(scenario, metric, value, goal="", ok=None):
    rows.append(f"| {scenario} | {metric} | {value} | {goal} | {'' if ok is None else ('PASS' if ok else 'FAIL')} |")
names = {
    "saturated": "saturated: all %s queues busy" % r["queues"],
    "borrowing": "borrowing: %s of each cohort's %s queues busy, the rest idle (lending)" % (
        (int(r["cohort_size"]) + 1) // 2, r["cohort_size"]),
}
for s in ("saturated", "borrowing"):
    n = names[s]
    row(n, "pending jobs / running jobs per pass (average)", "%s / %s" % (r[s + ".pending_avg"], r[s + ".running_avg"]))
    p99 = f(s + ".pass_ms_p99")
    row(n, "scheduling pass with queues: p50 / p99 / max", "%.2f ms / %.2f ms / %.2f ms" % (
        f(s + ".pass_ms_p50"), p99, f(s + ".pass_ms_max")), "p99 < 50 ms", p99 < 50)
    row(n, "the same inputs without queues (one implicit queue): p50 / p99", "%.2f ms / %.2f ms" % (
        f(s + ".baseline_ms_p50"), f(s + ".baseline_ms_p99")))
    fe = f(s + ".fairness_error")
    row(n, "fairness error (largest deviation of a busy queue's slot-ticks from the even share)",
        "%.2f %%" % (100 * fe), "< 5 %", fe < 0.05)
    row(n, "slots in use (utilization)", "%.1f %%" % (100 * f(s + ".utilization")))
    row(n, "placements / preemptions", "%s / %s" % (r[s + ".placements"], r[s + ".preemptions"]))
text = f"""{SECTION}

Run {now} by `bench/scheduler/run.sh` (commit {commit}, {elapsed} s). Machine: {cores} cores ({cpu}); load average {l0} at the start, {l1} at the end.
A simulated cluster of {int(r['workers']):,} GPU workers x {r['slots']} slots drives the pure scheduler (`coordinator/scheduler`) tick by tick: jobs end, one `Schedule()` pass runs over every pending job with the queues' quotas, decayed usage and running jobs, its placements start and its preemptions stop their victims (who go back to pending with the work they had left). {r['queues']} queues with equal nominal quota (the cluster's slots / queues) in cohorts of {r['cohort_size']}; each busy queue keeps {r['pending_per_queue']} jobs pending; {r['warmup']} ticks of warm-up, then {r['ticks']} measured. The baseline schedules each measured pass's same jobs and workers without queues. Fairness error: over the measured ticks, the largest relative deviation of a busy queue's slot-ticks from the busy queues' even share.

| scenario | metric | value | goal | result |
| --- | --- | --- | --- | --- |
""" + "\n".join(rows) + "\n\n"
print(text)
if write != "1":
    sys.exit(0)
md = open(results).read()
if SECTION in md:
    start = md.index(SECTION)
    nxt = md.find("\n## ", start + len(SECTION))
    md = md[:start] + text + (md[nxt + 1:] if nxt >= 0 else "")
else:
    anchor = md.find("\n## DDP")
    md = md[:anchor + 1] + text + md[anchor + 1:] if anchor >= 0 else md + "\n" + text
open(results, "w").write(md)
print("run.sh: wrote", SECTION, "to", results)
EOF
