#!/usr/bin/env bash
# Coordinator failover on PostgreSQL (issue #29; docs/operator.md, "High
# availability"): two trainctl-coordinator processes on one throwaway
# PostgreSQL (bench/pg.sh). Each trial stops the active one and measures the
# time until the standby serves ("listening on" in its output, then checked
# with a CLI call that must succeed against it alone):
#   - TRIALS times SIGKILL (the active's connection closes at once: bounded
#     by --standby-poll-ms); the killed one is started again and must come
#     back as a standby;
#   - STOP_TRIALS times SIGSTOP (its session stays open until PostgreSQL ends
#     it: bounded by --leader-lease-s + --standby-poll-ms); after SIGCONT the
#     stopped one must step down (its "deposed" line) and come back a standby.
# Prints a table and writes the "## Coordinator failover" section of
# bench/RESULTS.md.
#
#   bench/ha/run.sh [BUILD_DIR]     (default: build; builds nothing)
#   TRIALS [10]  STOP_TRIALS [3]  LEASE_S [5]  POLL_MS [500]
#   RESULTS [bench/RESULTS.md]  WRITE_RESULTS [1]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
COORD="$BUILD/coordinator/trainctl-coordinator"
CLI="$BUILD/client/trainctl"
for b in "$COORD" "$CLI"; do
  [[ -x "$b" ]] || { echo "run.sh: $b not found; build trainctl-coordinator and trainctl in $BUILD" >&2; exit 2; }
done
TRIALS="${TRIALS:-10}"
STOP_TRIALS="${STOP_TRIALS:-3}"
LEASE_S="${LEASE_S:-5}"
POLL_MS="${POLL_MS:-500}"
RESULTS="${RESULTS:-$ROOT/bench/RESULTS.md}"
WRITE_RESULTS="${WRITE_RESULTS:-1}"

WORK="$(mktemp -d /tmp/trainctl-bench-ha.XXXXXX)"
OUT="$WORK/results.txt"
: > "$OUT"
source "$ROOT/bench/pg.sh"
declare -A PID PORT LOG
cleanup() {
  local n
  for n in "${!PID[@]}"; do
    kill -KILL "${PID[$n]}" 2>/dev/null || true
    wait "${PID[$n]}" 2>/dev/null || true
  done
  stop_pg
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME: a coordinator on PORT[NAME], its output (stdout+stderr) in a
# new log file LOG[NAME].
start() {
  local n=$1
  LOG[$n]="$WORK/$n-$(date +%s%N).log"
  "$COORD" --listen "127.0.0.1:${PORT[$n]}" --store "$PG_STORE" --admin-token-file "$WORK/admin.token" \
    --leader-lease-s "$LEASE_S" --standby-poll-ms "$POLL_MS" > "${LOG[$n]}" 2>&1 &
  PID[$n]=$!
}
# wait_log NAME TEXT LIMIT_S [FROM]: polls NAME's log every 10 ms for TEXT
# after its first FROM bytes (a re-executed coordinator keeps its log).
wait_log() {
  local deadline=$(( $(now_ms) + $3 * 1000 )) from=${4:-0}
  while (( $(now_ms) < deadline )); do
    tail -c +$(( from + 1 )) "${LOG[$1]}" 2>/dev/null | grep -q -- "$2" && return 0
    sleep 0.01
  done
  echo "run.sh: no '$2' from $1 within $3 s:" >&2
  tail -5 "${LOG[$1]}" >&2
  return 1
}
# serves NAME: a call to NAME alone succeeds (a standby would point elsewhere;
# a list of one address still follows that hint, so the other is killed or
# stopped when this is asked).
serves() {
  "$CLI" --coordinator "127.0.0.1:${PORT[$1]}" --token "$(cat "$WORK/admin.token")" --timeout 5 list -o json > /dev/null 2>&1
}

start_pg || { echo "run.sh: $PG_WHY" >&2; exit 2; }
{
  echo "meta.date=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "meta.cores=$(nproc)"
  echo "meta.load_start=$(cut -d' ' -f1 /proc/loadavg)"
  echo "meta.commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "meta.flags=--leader-lease-s $LEASE_S --standby-poll-ms $POLL_MS"
} >> "$OUT"
PORT[a]=$(free_port); PORT[b]=$(free_port)
start a
wait_log a "listening on" 60
start b
wait_log b "standby" 60
active=a standby=b
echo "trainctl coordinator failover: $TRIALS SIGKILL and $STOP_TRIALS SIGSTOP trials; results in $WORK"

size() { stat -c %s "${LOG[$1]}"; }
for i in $(seq 1 "$TRIALS"); do
  from=$(size "$standby")
  t0=$(now_ms)
  kill -KILL "${PID[$active]}"; wait "${PID[$active]}" 2>/dev/null || true
  wait_log "$standby" "listening on" 30 "$from"
  t1=$(now_ms)
  serves "$standby" || { echo "run.sh: $standby did not serve after taking over" >&2; exit 1; }
  echo "kill.$i.ms=$(( t1 - t0 ))" >> "$OUT"
  echo "  SIGKILL trial $i: $standby serves $(( t1 - t0 )) ms after $active was killed"
  start "$active"
  wait_log "$active" "standby" 60
  tmp=$active; active=$standby; standby=$tmp
done

for i in $(seq 1 "$STOP_TRIALS"); do
  from=$(size "$standby") from_active=$(size "$active")
  t0=$(now_ms)
  kill -STOP "${PID[$active]}"
  wait_log "$standby" "listening on" $(( LEASE_S * 4 + 30 )) "$from"
  t1=$(now_ms)
  serves "$standby" || { echo "run.sh: $standby did not serve after taking over" >&2; exit 1; }
  kill -CONT "${PID[$active]}"
  t2=$(now_ms)
  wait_log "$active" "deposed" 60 "$from_active"
  t3=$(now_ms)
  # Re-executed (same pid, same log) as a standby naming the new active one.
  wait_log "$active" "active=127.0.0.1:${PORT[$standby]}" 60 "$from_active" \
    || { echo "run.sh: $active did not come back a standby" >&2; exit 1; }
  echo "stop.$i.ms=$(( t1 - t0 ))" >> "$OUT"
  echo "cont_to_deposed.$i.ms=$(( t3 - t2 ))" >> "$OUT"
  echo "  SIGSTOP trial $i: $standby serves $(( t1 - t0 )) ms after $active was stopped; after SIGCONT $active stepped down in $(( t3 - t2 )) ms"
  tmp=$active; active=$standby; standby=$tmp
done
echo "meta.load_end=$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT"
echo "meta.pg_lease_note=idle_session_timeout" >> "$OUT"

/usr/bin/python3 - "$OUT" "$RESULTS" "$WRITE_RESULTS" <<'PY'
import re, statistics, sys
out, res_md, write = sys.argv[1], sys.argv[2], sys.argv[3] != "0"
r = dict(l.rstrip("\n").split("=", 1) for l in open(out) if "=" in l)
def series(prefix):
    return sorted(int(v) for k, v in r.items() if k.startswith(prefix + ".") and k.endswith(".ms"))
def summary(v):
    if not v:
        return "n/a"
    return (f"p50 {statistics.median(v):,.0f} ms, max {max(v):,} ms, min {min(v):,} ms "
            f"(n={len(v)}: {', '.join(f'{x:,}' for x in v)})")
kill, stop, cont = series("kill"), series("stop"), series("cont_to_deposed")
rows = [
    ("SIGKILL the active coordinator", "until the standby serves", summary(kill), "< 10 s",
     "PASS" if kill and max(kill) < 10000 else "FAIL"),
    ("SIGSTOP the active coordinator", "until the standby serves (lease + poll)", summary(stop), "< lease + 10 s",
     "PASS" if stop and max(stop) < int(r["meta.flags"].split()[1]) * 1000 + 10000 else "FAIL"),
    ("SIGCONT the stopped one", "until it steps down (its `deposed` line)", summary(cont), "", ""),
]
print()
for x in rows:
    print("  ".join(x))
if not write:
    sys.exit(0)
md = ["## Coordinator failover", "",
      f"Run {r.get('meta.date', '?')} by `bench/ha/run.sh` (commit {r.get('meta.commit', '?')}): two "
      f"trainctl-coordinator processes on one PostgreSQL {r.get('meta.pg_version', '?')} (Unix socket, same machine), "
      f"`{r.get('meta.flags', '?')}`; {r.get('meta.cores', '?')} cores, load average {r.get('meta.load_start', '?')} "
      f"at the start and {r.get('meta.load_end', '?')} at the end. 'Serves' = the standby printed `listening on` "
      "(timed by polling its output every 10 ms), then a CLI call to it alone succeeded. After each SIGKILL the "
      "killed one was started again and came back a standby; after each SIGCONT the stopped one logged `deposed`, "
      "re-executed and came back a standby. The same in `tests/ha_e2e_test.cc` with two workers and a job running: "
      "the job succeeds in its first attempt with nothing lost.", "",
      "| scenario | metric | value | goal | result |", "| --- | --- | --- | --- | --- |"]
md += ["| " + " | ".join(x) + " |" for x in rows]
section = "\n".join(md) + "\n"
text = open(res_md).read()
pat = re.compile(r"^## Coordinator failover\n.*?(?=^## |\Z)", re.S | re.M)
if pat.search(text):
    text = pat.sub(lambda m: section + ("\n" if m.end() < len(text) else ""), text, count=1)
else:
    text = text.rstrip("\n") + "\n\n" + section
open(res_md, "w").write(text)
print(f"\nwrote the '## Coordinator failover' section of {res_md}")
PY
echo "raw results: $OUT"
