#!/usr/bin/env bash
# The control plane at scale: starts one trainctl-coordinator per scenario on
# loopback, drives it with trainctl-bench-coordinator, prints a table and
# writes the "## Coordinator at scale" section of bench/RESULTS.md.
#
#   bench/coordinator/run.sh [BUILD_DIR]      (default: build; builds nothing)
#
# Sizes can be changed with environment variables (defaults in brackets):
#   WORKERS_SMALL [1000]  WORKERS_MID [5000]  WORKERS_LARGE [10000]  RAMP_PER_S [500]
#   STEADY_S [30]  JOBS [10000]  SUBMIT_CONCURRENCY [32]  WIDE_WORKERS [1000]  WIDE_JOBS [2000]
#   TELEMETRY_JOBS [125]  LOG_LINES [10]
#   TRIALS_CUT [20]  TRIALS_KILL [10]  RESULTS [bench/RESULTS.md]  WRITE_RESULTS [1]
#   HEARTBEAT_MS [1000]: the workers' heartbeat interval the coordinator
#   hands out (its lease is 3 intervals); the generator follows it
#   MAX_HEARTBEATS_PER_SEC [unset: the coordinator's default, 10000]: its
#   --max-heartbeats-per-sec (0: no bound, every worker keeps HEARTBEAT_MS
#   however many there are); the generator keeps to the terms it is told
#   SCENARIOS [hb_small hb_mid hb_large telemetry telemetry_pg jobs jobs_wide failure]
#   COORDINATOR_LIB_DIR [unset]: put first in the coordinator's (only its)
#   LD_LIBRARY_PATH, e.g. /var/cache/trainctl-grpc-release/lib for the
#   release build of Debian's gRPC (scripts/grpc-release.sh); the results
#   say which gRPC the coordinator loaded
# telemetry_pg is the telemetry scenario with the coordinator on a PostgreSQL
# store (a throwaway server from Debian's postgresql, Unix socket only, run as
# nobody when this runs as root); it is skipped when no server binaries are
# installed. "Coordinator at scale" in RESULTS.md is written by a run with the
# heartbeat scenarios, "Store backends" by a run with telemetry and
# telemetry_pg: `SCENARIOS="telemetry telemetry_pg" bench/coordinator/run.sh`
# rewrites only the latter.
# The whole run is bounded: about 9 minutes with the defaults, never more
# than 10 (every step has a hard timeout, capped by what is left of the 10
# minutes; a step that no longer fits is skipped). It stops everything it
# started.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
COORD="$BUILD/coordinator/trainctl-coordinator"
BENCH="$BUILD/bench/coordinator/trainctl-bench-coordinator"
for b in "$COORD" "$BENCH"; do
  [[ -x "$b" ]] || { echo "run.sh: $b not found; build the targets trainctl-coordinator and trainctl-bench-coordinator in $BUILD" >&2; exit 2; }
done

WORKERS_SMALL="${WORKERS_SMALL:-1000}"
WORKERS_MID="${WORKERS_MID:-5000}"
WORKERS_LARGE="${WORKERS_LARGE:-10000}"
RAMP_PER_S="${RAMP_PER_S:-500}"
STEADY_S="${STEADY_S:-30}"
JOBS="${JOBS:-10000}"
SUBMIT_CONCURRENCY="${SUBMIT_CONCURRENCY:-32}"
WIDE_WORKERS="${WIDE_WORKERS:-1000}"
WIDE_JOBS="${WIDE_JOBS:-2000}"
TELEMETRY_JOBS="${TELEMETRY_JOBS:-125}"
LOG_LINES="${LOG_LINES:-10}"
TRIALS_CUT="${TRIALS_CUT:-20}"
TRIALS_KILL="${TRIALS_KILL:-10}"
RESULTS="${RESULTS:-$ROOT/bench/RESULTS.md}"
WRITE_RESULTS="${WRITE_RESULTS:-1}"
SCENARIOS="${SCENARIOS:-hb_small hb_mid hb_large telemetry telemetry_pg jobs jobs_wide failure}"
want() { [[ " $SCENARIOS " == *" $1 "* ]]; }

WORK="$(mktemp -d /tmp/trainctl-bench-coordinator.XXXXXX)"
OUT="$WORK/results.txt"
: > "$OUT"
COORD_PID=""
BENCH_PID=""

# stop_coord [NAME]: SIGTERM, then SIGKILL after 15 s; records which it took.
stop_coord() {
  [[ -n "$COORD_PID" ]] || return 0
  local how="gone"
  if kill -0 "$COORD_PID" 2>/dev/null; then
    local t0 i state
    t0=$(date +%s%N)
    kill -TERM "$COORD_PID" 2>/dev/null || true
    how="SIGKILL: still running 15 s after SIGTERM"
    for i in $(seq 1 150); do
      state="$(cut -d' ' -f3 "/proc/$COORD_PID/stat" 2>/dev/null || true)"
      if [[ -z "$state" || "$state" == Z ]]; then
        how="exited $(( ($(date +%s%N) - t0) / 1000000 )) ms after SIGTERM"; break
      fi
      sleep 0.1
    done
    kill -KILL "$COORD_PID" 2>/dev/null || true
  fi
  wait "$COORD_PID" 2>/dev/null || true
  [[ -n "${1:-}" ]] && echo "stop.$1=$how" >> "$OUT"
  COORD_PID=""
}
cleanup() {
  if [[ -n "$BENCH_PID" ]]; then kill -TERM "$BENCH_PID" 2>/dev/null || true; wait "$BENCH_PID" 2>/dev/null || true; fi
  stop_coord
  stop_pg
  rm -f "$WORK"/*/state.db*
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Every scenario's coordinator runs with these (recorded in the results).
HEARTBEAT_MS="${HEARTBEAT_MS:-1000}"
COORD_FLAGS="--heartbeat-interval-ms $HEARTBEAT_MS --lease-timeout-ms $(( 3 * HEARTBEAT_MS )) --disconnect-grace-ms 1000"
if [[ -n "${MAX_HEARTBEATS_PER_SEC:-}" ]]; then
  COORD_FLAGS="$COORD_FLAGS --max-heartbeats-per-sec $MAX_HEARTBEATS_PER_SEC"
fi

# start_coord NAME [extra coordinator flags...]: sets COORD_PID, ADDR and ADMIN_FILE.
start_coord() {
  local name="$1"; shift
  mkdir -p "$WORK/$name"
  ADMIN_FILE="$WORK/$name/admin.token"
  local store=(--db "$WORK/$name/state.db")
  [[ -n "${COORD_STORE:-}" ]] && store=(--store "$COORD_STORE")
  LD_LIBRARY_PATH="${COORDINATOR_LIB_DIR:+$COORDINATOR_LIB_DIR${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" \
    "$COORD" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 "${store[@]}" --admin-token-file "$ADMIN_FILE" \
    $COORD_FLAGS "$@" \
    > "$WORK/$name/coord.out" 2> "$WORK/$name/coord.err" &
  COORD_PID=$!
  ADDR=""
  for _ in $(seq 1 100); do
    ADDR="$(head -1 "$WORK/$name/coord.out" 2>/dev/null | sed -n 's/^trainctl-coordinator listening on //p')"
    [[ -n "$ADDR" ]] && break
    kill -0 "$COORD_PID" 2>/dev/null || break
    sleep 0.1
  done
  # Its /metrics (the loop histograms the generator reads over the steady window).
  METRICS_ADDR=""
  for _ in $(seq 1 50); do
    METRICS_ADDR="$(cat "$WORK/$name/coord.out" "$WORK/$name/coord.err" 2>/dev/null |
      sed -n 's|.*metrics on http://\([^/ ]*\)/metrics.*|\1|p' | head -1)"
    [[ -n "$METRICS_ADDR" || -z "$ADDR" ]] && break
    sleep 0.1
  done
  if [[ -z "$ADDR" ]]; then
    echo "run.sh: coordinator did not start:" >&2
    cat "$WORK/$name/coord.err" >&2
    exit 1
  fi
}

# start_pg / stop_pg: bench/pg.sh (a throwaway PostgreSQL under $WORK/pg).
source "$ROOT/bench/pg.sh"

# bench NAME PREFIX TIMEOUT_S [bench flags...]
bench() {
  local name="$1" prefix="$2" limit="$3"; shift 3
  local left=$(( DEADLINE - $(date +%s) - 15 ))
  (( limit > left )) && limit=$left
  if (( limit < 20 )); then
    echo "== $name: skipped, the 10-minute budget is spent"
    echo "$prefix.exit=skipped" >> "$OUT"
    return 0
  fi
  echo "== $name (coordinator pid $COORD_PID at $ADDR; limit ${limit}s)"
  local rc=0
  # timeout forwards TERM (cleanup) to the generator; KILL after the limit.
  timeout --signal=KILL "$limit" "$BENCH" --target="$ADDR" --admin-token-file="$ADMIN_FILE" --coord-pid="$COORD_PID" \
    --metrics-address="$METRICS_ADDR" \
    --out="$OUT" --prefix="$prefix." "$@" > >(tee "$WORK/$name/bench.log") 2>&1 &
  BENCH_PID=$!
  wait "$BENCH_PID" || rc=$?
  BENCH_PID=""
  echo "$prefix.exit=$rc" >> "$OUT"
  # The coordinator's own complaints (first lines), for the record.
  if [[ -s "$WORK/$name/coord.err" ]]; then
    echo "  (coordinator stderr: $(wc -l < "$WORK/$name/coord.err") lines; first: $(head -1 "$WORK/$name/coord.err" | cut -c1-160))"
  fi
  return 0
}

START=$(date +%s)
DEADLINE=$(( START + 600 ))
echo "trainctl coordinator benchmark: results in $WORK"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
{
  echo "meta.date=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "meta.cores=$(nproc)"
  echo "meta.cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
  echo "meta.load_start=$(cut -d' ' -f1 /proc/loadavg)"
  echo "meta.commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "meta.build=$(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2)"
  echo "meta.coordinator_flags=$COORD_FLAGS"
  echo "meta.coordinator_grpc=$(LD_LIBRARY_PATH="${COORDINATOR_LIB_DIR:+$COORDINATOR_LIB_DIR${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" \
    ldd "$COORD" | awk '$1 == "libgrpc.so.29" {print $3}')"
} >> "$OUT"

# 1a. Heartbeats, small point.
if want hb_small; then
  start_coord hb_small
  bench hb_small hb_small 90 --mode=heartbeat --workers="$WORKERS_SMALL" --ramp-per-s="$RAMP_PER_S" \
    --warmup-s=5 --steady-s=20 --mass-loss-fraction=0.1
  stop_coord hb_small
fi

# 1b. Heartbeats, middle point.
if want hb_mid; then
  start_coord hb_mid
  bench hb_mid hb_mid $(( WORKERS_MID / RAMP_PER_S + 90 )) --mode=heartbeat --workers="$WORKERS_MID" \
    --ramp-per-s="$RAMP_PER_S" --ramp-timeout-s=$(( WORKERS_MID / RAMP_PER_S + 40 )) --warmup-s=5 --steady-s=20
  stop_coord hb_mid
fi

# 1c. Heartbeats, large point; failure detection under that load; mass loss.
if want hb_large; then
  start_coord hb_large
  RAMP_LIMIT=$(( WORKERS_LARGE / RAMP_PER_S + 40 ))
  bench hb_large hb_large $(( RAMP_LIMIT + STEADY_S + 110 )) --mode=heartbeat --workers="$WORKERS_LARGE" \
    --ramp-per-s="$RAMP_PER_S" --ramp-timeout-s="$RAMP_LIMIT" --warmup-s=5 --steady-s="$STEADY_S" \
    --trials-under-load=10 --mass-loss-fraction=0.1 --mass-loss-timeout-s=45
  stop_coord hb_large
fi

TEL_RAMP=$(( (WORKERS_LARGE + TELEMETRY_JOBS) / RAMP_PER_S + 40 ))

# 1d. Telemetry at scale: TELEMETRY_JOBS jobs × 8 simulated ranks, each
# sending a metric point and LOG_LINES log lines a second, beside the large
# point's heartbeating workers; a watcher on every job.
if want telemetry; then
  start_coord telemetry --rendezvous-timeout-s 3600 --progress-timeout-s 3600
  bench telemetry tel $(( TEL_RAMP + STEADY_S + 120 )) --mode=telemetry --workers="$WORKERS_LARGE" \
    --telemetry-jobs="$TELEMETRY_JOBS" --ranks-per-job=8 --log-lines-per-s="$LOG_LINES" \
    --ramp-per-s="$RAMP_PER_S" --ramp-timeout-s="$TEL_RAMP" --warmup-s=5 --steady-s="$STEADY_S" --drain-s=10
  stop_coord telemetry
fi

# 1e. The same on a PostgreSQL store (the store's own CPU reported beside
# the coordinator's): what the shared store of an active/standby pair costs.
if want telemetry_pg; then
  if start_pg; then
    COORD_STORE="$PG_STORE" start_coord telemetry_pg --rendezvous-timeout-s 3600 --progress-timeout-s 3600
    bench telemetry_pg telpg $(( TEL_RAMP + STEADY_S + 120 )) --mode=telemetry --workers="$WORKERS_LARGE" \
      --telemetry-jobs="$TELEMETRY_JOBS" --ranks-per-job=8 --log-lines-per-s="$LOG_LINES" \
      --ramp-per-s="$RAMP_PER_S" --ramp-timeout-s="$TEL_RAMP" --warmup-s=5 --steady-s="$STEADY_S" --drain-s=10 \
      --store-pid="$PG_PID"
    stop_coord telemetry_pg
    stop_pg
  else
    echo "== telemetry_pg: skipped: $PG_WHY"
    echo "telpg.exit=skipped: $PG_WHY" >> "$OUT"
  fi
fi

# 2a. Job submission and scheduling with a deep queue (no free slot). Long
# rendezvous/progress timeouts: the busy workers' jobs must stay RUNNING.
if want jobs; then
  start_coord jobs --rendezvous-timeout-s 3600 --progress-timeout-s 3600
  bench jobs jobs 150 --mode=jobs --jobs="$JOBS" --concurrency="$SUBMIT_CONCURRENCY" --submit-budget-s=100 \
    --busy-workers=2 --sched-trials=20 --probe-calls=30
  stop_coord jobs
fi

# 2b. The same with many busy workers: the cost of one scheduling pass
# grows with pending jobs × workers.
if want jobs_wide; then
  start_coord jobs_wide --rendezvous-timeout-s 3600 --progress-timeout-s 3600
  bench jobs_wide jobs_wide 100 --mode=jobs --jobs="$WIDE_JOBS" --concurrency="$SUBMIT_CONCURRENCY" \
    --submit-budget-s=40 --busy-workers="$WIDE_WORKERS" --sched-trials=10 --probe-calls=20
  stop_coord jobs_wide
fi

# 3. Failure detection, idle coordinator: stream cut, SIGKILLed process.
if want failure; then
  start_coord failure
  bench failure fail 90 --mode=failure --trials-cut="$TRIALS_CUT" --trials-kill="$TRIALS_KILL" --batch=10
  stop_coord failure
fi

echo "meta.elapsed_s=$(( $(date +%s) - START ))" >> "$OUT"
echo "meta.load_end=$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT"

python3 "$ROOT/bench/coordinator/report.py" "$OUT" "$RESULTS" "$WRITE_RESULTS"
echo "raw results: $OUT"
