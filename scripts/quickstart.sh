#!/usr/bin/env bash
# The README's first command: installs the Debian packages that building and
# running need (scripts/install-deps.sh build: not the test-only ones, which
# scripts/test.sh installs), builds the four binaries, and trains the
# classic DDP example (examples/mlp-synthetic.yaml, 2 ranks) through a local
# coordinator, worker daemon and rank processes, streaming its progress. The
# trained model ends in ./checkpoints/mlp-synthetic/<job id>/<job id>.model.pt
# (the run's `final model:` line says where); then each phase's time.
#
# A few lines of its own: apt's and the build's output go to
# build/quickstart-{apt,build}.log, and their end is shown when they fail.
#
#   scripts/quickstart.sh [JOB.yaml] [--set key=value ...]
#   JOBS=4 scripts/quickstart.sh    # build with 4 jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${JOBS:-2}
job=examples/mlp-synthetic.yaml
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a job file first; options only: the example
  job=$1
  shift
fi
mkdir -p build
apt_log=build/quickstart-apt.log
build_log=build/quickstart-build.log

# Each phase's time, printed at the end however the run ends.
declare -a marks=()
mark_at=$SECONDS
mark() {  # mark NAME: the time since the previous mark is NAME's
  marks+=("$(printf '%s %d s' "$1" $((SECONDS - mark_at)))")
  mark_at=$SECONDS
}
print_marks() {
  local rc=$? all
  all=$(printf '%s, ' "${marks[@]}")
  echo "quickstart: $((SECONDS / 60)) min $((SECONDS % 60)) s in all (${all%, }), exit $rc"
  exit "$rc"
}
trap print_marks EXIT

# The figures of docs/testing.md ("The quick start").
echo "quickstart: on a fresh Debian 12 machine with 2 cores about 3.5 min: apt fetches ~340 MB of packages" \
     "(~40 s on a fast mirror), the build takes ~3 min cold (less with more cores: JOBS=N), the example ~1 s"

bash scripts/install-deps.sh build --log "$apt_log"
mark apt

# show_failure LOG: the end of LOG, where the error is.
show_failure() {
  echo "quickstart: failed; the end of $1:" >&2
  tail -n 40 "$1" >&2
}
echo "quickstart: configuring and building trainctl, trainctl-rank, trainctl-coordinator, trainctl-worker with $jobs jobs (log: $build_log)"
# The flags of scripts/test.sh's build (line tables only: a third less
# compile time than -g; a unity build: half the cold time), so that the test
# command reuses this build/.
if ! cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DTRAINCTL_UNITY=ON >"$build_log" 2>&1; then
  show_failure "$build_log"
  exit 1
fi
# Progress on one line on a terminal (every 10% otherwise), from ninja's
# "[done/total]" status.
tty=0
if [ -t 1 ]; then tty=1; fi
if ! cmake --build build -j "$jobs" --target trainctl trainctl-rank trainctl-coordinator trainctl-worker 2>&1 |
     tee -a "$build_log" |
     awk -v tty="$tty" '
       /^\[[0-9]+\/[0-9]+\]/ {
         s = $1; gsub(/[][]/, "", s); split(s, a, "/")
         pct = int(100 * a[1] / a[2])
         if (tty) { printf "\r  build: %d/%d (%d%%)", a[1], a[2], pct; shown = 1 }
         else if (pct >= next_pct) { printf "  build: %d/%d (%d%%)\n", a[1], a[2], pct; next_pct = pct - pct % 10 + 10 }
       }
       END { if (shown) printf "\n" }'; then
  show_failure "$build_log"
  exit 1
fi
mark configure+build

echo "quickstart: training $job"
rc=0
build/client/trainctl run "$job" "$@" || rc=$?
mark run
exit "$rc"
