#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages),
# builds everything, runs the whole test suite, then builds the libraries
# that do not use LibTorch with address+undefined sanitizers and runs their
# tests too. Exits non-zero when anything fails.
#
#   scripts/test.sh            # everything (what CI runs)
#   SKIP_SANITIZE=1 scripts/test.sh
#   SKIP_FUZZ=1 scripts/test.sh            # without the short fuzzing stage
#   SKIP_TSAN=1 scripts/test.sh            # without the ThreadSanitizer stage (scripts/tsan.sh)
#   FUZZ_SECONDS=60 scripts/test.sh        # fuzz each target longer (default: 3000
#                                          # inputs from a fixed seed, at most 20 s)
#   CTEST_ARGS="-L long" scripts/test.sh   # the long tests (not run by default)
#   SKIP_LIBTORCH2=1 scripts/test.sh       # without the LibTorch 2.x stage (a Debian
#                                          # trixie root: scripts/test-libtorch2.sh)
#   LIBTORCH2=all scripts/test.sh          # that stage with every target and test
#                                          # (default: the LibTorch libraries and their tests, --torch-libs)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${JOBS:-2}
# Each stage's time, printed at the end however the run ends (docs/testing.md
# keeps the figures of a cold run).
declare -a marks=()
mark_at=$SECONDS
mark() {  # mark NAME: the time since the previous mark is NAME's
  marks+=("$(printf '%-16s %5d s' "$1" $((SECONDS - mark_at)))")
  mark_at=$SECONDS
}
print_marks() {
  local rc=$?
  echo "== test.sh stage times (total $((SECONDS / 60)) min $((SECONDS % 60)) s, exit $rc)"
  printf '  %s\n' "${marks[@]}"
  local pid
  for pid in ${libtorch2_ahead_pid:-} ${ahead_pid:-}; do
    $sudo kill -- "-$pid" 2>/dev/null || $sudo kill "$pid" 2>/dev/null || true
  done
  exit "$rc"
}
trap print_marks EXIT

# in_background LOG CMD...: CMD in the background with its output in LOG, in
# a process group of its own (killed with it when this run ends early) but
# in this session, at the lowest CPU priority and a low I/O one: it takes
# only the CPU time the foreground leaves idle. (A new session would put
# it in an autogroup of its own where the kernel has autogroups on, and
# there nice counts only inside a group.) $! is its pid.
in_background() {
  local log=$1
  shift
  perl -e 'setpgrp(0, 0); exec {$ARGV[0]} @ARGV or die "in_background: exec $ARGV[0]: $!\n"' \
    nice -n 19 ionice -c 2 -n 7 "$@" >"$log" 2>&1 &
}

bash scripts/install-deps.sh
mark install-deps

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
# The LibTorch 2.x stage's Debian trixie root (scripts/test-libtorch2.sh) is
# made in the background from here on, then its LibTorch libraries built
# there (--build-libs): debootstrap and the package downloads wait on the
# network and the disk, and the build takes the CPU time the foreground
# leaves idle. The stage itself (after the main suite) waits for it (the
# script's lock) and runs the tests. The root is cached in
# /var/cache/trainctl-trixie: a no-op when there.
libtorch2_ahead_pid=""
libtorch2_ahead_log=""
if [ -z "${SKIP_LIBTORCH2:-}" ]; then
  if ! command -v debootstrap >/dev/null; then
    $sudo apt-get install -y -qq --no-install-recommends debootstrap
  fi
  libtorch2_ahead_log=$(mktemp /tmp/trainctl-libtorch2-ahead.XXXXXX)
  in_background "$libtorch2_ahead_log" $sudo env JOBS="$jobs" bash scripts/test-libtorch2.sh --build-libs
  libtorch2_ahead_pid=$!
  echo "== LibTorch 2.x root and build: being made in the background (log: $libtorch2_ahead_log)"
fi

# A compile cache under /var/cache, like the trixie root and the TSan
# abseil: a machine that keeps /var/cache recompiles only what changed (every
# build below: build/, build-asan/, build-fuzz/, build-tsan/); a machine
# without it compiles everything, as the cold figures in docs/testing.md.
# Keyed by content (paths relative to the clone, so any clone directory
# hits); CCACHE_DISABLE=1 measures a cold build.
if [ -z "${CCACHE_DISABLE:-}" ]; then
  if ! command -v ccache >/dev/null; then
    $sudo apt-get install -y -qq --no-install-recommends ccache
  fi
  export CCACHE_DIR=${TRAINCTL_CCACHE_DIR:-/var/cache/trainctl-ccache}
  $sudo mkdir -p "$CCACHE_DIR"
  $sudo chown "$(id -u):$(id -g)" "$CCACHE_DIR"
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  # What ccache needs for the precompiled <torch/torch.h> (cmake/TorchPch.cmake).
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  ccache --max-size 12G >/dev/null
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
  echo "== compile cache: $CCACHE_DIR ($(ccache --show-stats 2>/dev/null | grep -i -m1 'cache size' | xargs))"
fi

echo "== build (RelWithDebInfo, line tables only) =="
# -g1 (file and line, no variables): a third less compile time than -g
# (docs/testing.md); a crash's stack trace needs no more. A unity build
# (TRAINCTL_UNITY: sources compiled in batches, headers parsed once a batch)
# takes about half the cold time; the sanitizer stages compile file by file.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DTRAINCTL_UNITY=ON
cmake --build build -j "$jobs"
mark build

# The sanitizer and fuzzing builds of the stages below, made ahead in the
# background (scripts/build-ahead.sh) while the tests leave CPU idle; each
# stage waits for its step, then runs it again (a no-op, or its error).
# The TSan stage leaves out the tests that serve or call gRPC: gRPC core is
# not instrumented, and TSan reports its callback API's own hand-overs
# (header code) as races (docs/testing.md); scripts/tsan.sh alone runs them
# too, with scripts/tsan.supp.
tsan_exclude=${TSAN_EXCLUDE-'e2e|^cli_|^client_test$|^failover_test$|^dashboard_api_test$|^script_job_test$|^daemon_session_test$|^deploy_verify_units$|^docs_flags_test$|python'}
ahead_steps=()
if [ -z "${SKIP_SANITIZE:-}" ]; then ahead_steps+=(asan); fi
if [ -z "${SKIP_FUZZ:-}" ]; then ahead_steps+=(fuzz); fi
if [ -z "${SKIP_TSAN:-}" ]; then ahead_steps+=(tsan); fi
ahead_pid=""
ahead_dir=$(mktemp -d /tmp/trainctl-ahead.XXXXXX)
if [ ${#ahead_steps[@]} -gt 0 ]; then
  in_background "$ahead_dir/log" env JOBS="$jobs" TSAN_EXCLUDE="$tsan_exclude" \
    bash scripts/build-ahead.sh "$ahead_dir" "${ahead_steps[@]}"
  ahead_pid=$!
  echo "== ${ahead_steps[*]} builds: made ahead in the background (log: $ahead_dir/log)"
fi
ahead_wait() {  # ahead_wait STEP: until build-ahead.sh's STEP has ended (or it has stopped)
  while [ -n "$ahead_pid" ] && [ ! -e "$ahead_dir/$1.rc" ] && kill -0 "$ahead_pid" 2>/dev/null; do
    sleep 1
  done
}

echo "== tests =="
ctest --test-dir build --output-on-failure -j "$jobs" ${CTEST_ARGS:--LE long}
mark tests

echo "== thread-safety analysis of the LibTorch code (clang -fsyntax-only over build/'s LibTorch files) =="
JOBS="$jobs" bash scripts/thread-safety.sh
mark thread-safety

echo "== format check (clang-format --dry-run over the folders scripts/format-check.sh lists) =="
bash scripts/format-check.sh
mark format-check

if [ -z "${SKIP_SANITIZE:-}" ]; then
  echo "== sanitizer build (clang: address+undefined and the thread-safety analysis, without LibTorch) =="
  ahead_wait asan
  JOBS="$jobs" bash scripts/build-ahead.sh - asan
  mark asan-build
  # Leaks inside uninstrumented libraries (each explained): scripts/lsan.supp.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp" \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE long
  mark asan-tests
fi
if [ -z "${SKIP_FUZZ:-}" ]; then
  # Builds the libFuzzer targets (clang, ASan+UBSan, build-fuzz/) and runs
  # each briefly from the seed corpus: a regression in a parser's handling
  # of hostile input fails CI (scripts/fuzz.sh, docs/fuzzing.md).
  # Reproducible by default (fixed seed, bounded inputs) so that CI fails
  # only on a regression; long exploratory runs are scripts/fuzz.sh's job.
  echo "== fuzz =="
  ahead_wait fuzz
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    JOBS="$jobs" bash scripts/fuzz.sh "$FUZZ_SECONDS"
  else
    JOBS="$jobs" FUZZ_SEED=1 FUZZ_RUNS=3000 bash scripts/fuzz.sh 20
  fi
  mark fuzz
fi
# A bounded stage (LibTorch 2.x, TSan): runs "$@" until minute $end_by of
# this run (the caller sets end_by and elapsed). Cut short is said loudly and
# does not fail the run; any other failure does. $1: the stage's name, $2:
# the script that runs it alone.
run_bounded() {
  local name=$1 script=$2 rc=0
  shift 2
  $sudo timeout --kill-after=30s "$((end_by - elapsed))m" "$@" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "== $name stage CUT SHORT at ${end_by} min of this run (CI's limit is 90): INCOMPLETE; run $script"
  elif [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
}
if [ -z "${SKIP_LIBTORCH2:-}" ]; then
  # The LibTorch targets built and tested against LibTorch 2.6 (gcc 14) in
  # the trixie root made in the background above: a GPU machine has a
  # current LibTorch, Debian 12 has 1.13. Bounded like the TSan stage
  # (LIBTORCH2_START_MIN, LIBTORCH2_END_MIN); NOT RUN or CUT SHORT is said
  # loudly and does not fail the run; a failed build or test does.
  start_by=${LIBTORCH2_START_MIN:-62}
  end_by=${LIBTORCH2_END_MIN:-82}
  # The root and build made ahead (above): waited for until the stage's end
  # at the latest; a failure there is told, and the stage makes the root and
  # builds again, failing in the open if it fails again.
  while kill -0 "$libtorch2_ahead_pid" 2>/dev/null && [ $((SECONDS / 60)) -lt "$end_by" ]; do sleep 1; done
  rc=0
  if kill -0 "$libtorch2_ahead_pid" 2>/dev/null; then
    rc=124
  else
    wait "$libtorch2_ahead_pid" || rc=$?
    libtorch2_ahead_pid=""
  fi
  tail -n 16 "$libtorch2_ahead_log"
  if [ "$rc" -ne 0 ]; then
    echo "== the LibTorch 2.x root and build made ahead: exit $rc (log: $libtorch2_ahead_log)"
  fi
  mark libtorch2-ahead
  elapsed=$((SECONDS / 60))
  if [ "$elapsed" -ge "$start_by" ]; then
    echo "== LibTorch 2.x stage NOT RUN: this run has taken ${elapsed} min (starts only before ${start_by}); run scripts/test-libtorch2.sh"
  else
    echo "== LibTorch 2.x (Debian trixie root) =="
    scope=--torch-libs
    if [ "${LIBTORCH2:-}" = all ]; then scope=""; fi
    run_bounded "LibTorch 2.x" scripts/test-libtorch2.sh env JOBS="$jobs" bash scripts/test-libtorch2.sh $scope
    mark libtorch2
  fi
fi
if [ -z "${SKIP_TSAN:-}" ]; then
  # clang -fsanitize=thread over the tests that do not serve or call gRPC
  # (tsan_exclude above), with an instrumented abseil (scripts/tsan.sh; docs/testing.md). Bounded:
  # CI stops a run at 90 minutes, so the stage starts only within
  # TSAN_START_MIN minutes of this run and is given until TSAN_END_MIN; a
  # stage cut short, or not started, is said loudly (never silently), and
  # does not turn a green suite red. A race it reports fails the run.
  start_by=${TSAN_START_MIN:-72}
  end_by=${TSAN_END_MIN:-85}
  ahead_wait tsan
  mark tsan-ahead
  elapsed=$((SECONDS / 60))
  if [ "$elapsed" -ge "$start_by" ]; then
    echo "== ThreadSanitizer stage NOT RUN: this run has taken ${elapsed} min (starts only before ${start_by}); run scripts/tsan.sh"
  else
    echo "== ThreadSanitizer =="
    run_bounded ThreadSanitizer scripts/tsan.sh env JOBS="$jobs" TSAN_EXCLUDE="$tsan_exclude" bash scripts/tsan.sh
    mark tsan
  fi
fi
echo "== all tests passed =="
